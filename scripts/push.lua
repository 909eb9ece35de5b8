-- push.lua: add jobs to one bucket; a job whose ID exists already is left alone.
-- KEYS[1] pool hash  KEYS[2] bucket zset  KEYS[3] ready-list key prefix of the bucket
-- ARGV[1] wake channel  ARGV[2] ready channel prefix  ARGV[3] publish command
-- ARGV[4..] seven values per job:
--   id, topic, delay_ms (-1 when run_at_ms holds the due time), run_at_ms,
--   ttr_ms, max_attempts, body
-- returns one integer per job: 1 created, 0 the ID existed already
-- Running it twice creates nothing new: the second run finds every ID.

local pool, bucket, ready_prefix = KEYS[1], KEYS[2], KEYS[3]
local wake, ready_channel, pub = ARGV[1], ARGV[2], ARGV[3]

local now = now_us()
local now_ms = math.floor(now / 1000)
local created, first_due = {}, nil
local ready_count, topics = {}, {}

for i = 4, #ARGV, 7 do
  local id, topic = ARGV[i], ARGV[i + 1]
  if redis.call('HEXISTS', pool, id) == 1 then
    created[#created + 1] = 0
  else
    local delay, due = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
    if delay >= 0 then
      due = due_ms(now, delay)
    end
    local job = {
      state = DELAYED, attempts = 0, max = tonumber(ARGV[i + 5]), ttr = tonumber(ARGV[i + 4]),
      at = due, lease = 0, topic = topic, err = '', body = ARGV[i + 6],
    }
    if due <= now_ms then
      redis.call('RPUSH', ready_prefix .. topic, id) -- first: see job.lua
      job.state, job.at = READY, now_ms
      redis.call('HSET', pool, id, encode(job))
      if not ready_count[topic] then
        ready_count[topic] = 0
        topics[#topics + 1] = topic
      end
      ready_count[topic] = ready_count[topic] + 1
    else
      redis.call('HSET', pool, id, encode(job))
      redis.call('ZADD', bucket, due, id)
      if first_due == nil or due < first_due then
        first_due = due
      end
    end
    created[#created + 1] = 1
  end
end

-- Wake as many consumers of each topic as jobs became ready.
for _, topic in ipairs(topics) do
  redis.call(pub, ready_channel .. topic, ready_count[topic])
end
-- Wake the bucket's handler when a new job became the earliest of the bucket.
if first_due ~= nil then
  wake_if_first(bucket, pub, wake, first_due, now)
end
return created
