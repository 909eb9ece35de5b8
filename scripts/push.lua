-- push.lua: add jobs to one bucket; a job whose ID exists already is left alone.
-- KEYS[1] pool hash  KEYS[2] bucket zset  KEYS[3] ready-list key prefix of the bucket
-- ARGV[1] wake channel  ARGV[2] ready channel prefix  ARGV[3] publish command
-- ARGV[4..] three values per job:
--   id, delay_ms ("" when the job's at_ms holds its due time), and the job
--   encoded as a delayed job (job.lua), with no attempts, lease or error
-- returns one integer per job: 1 created, 0 the ID existed already
-- Running it twice creates nothing new: the second run finds every ID.

local pool, bucket, ready_prefix = KEYS[1], KEYS[2], KEYS[3]
local wake, ready_channel, pub = ARGV[1], ARGV[2], ARGV[3]

local now = now_us()
local now_ms = floor(now / 1000)
local created, first_due = {}, nil
local ready_count, topics = {}, {}

for i = 4, #ARGV, 3 do
  local id, delay, v = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local due
  if delay == '' then
    due = read48(v, AT)
  else
    due = due_ms(now, tonumber(delay))
    v = sub(v, 1, 9) .. u48(due) .. sub(v, 16)
  end
  if due > now_ms then
    -- The bucket is one of this script's keys: no write order to keep.
    local new = redis.call('HSETNX', pool, id, v)
    if new == 1 then
      redis.call('ZADD', bucket, due, id)
      if first_due == nil or due < first_due then
        first_due = due
      end
    end
    created[#created + 1] = new
  elseif redis.call('HEXISTS', pool, id) == 1 then
    created[#created + 1] = 0
  else
    local topic = sub(v, HEADER + 1, HEADER + byte(v, HEADER))
    redis.call('RPUSH', ready_prefix .. topic, id) -- first: see job.lua
    redis.call('HSET', pool, id, char(FORMAT + READY) .. sub(v, 2, 9) .. u48(now_ms) .. sub(v, 16))
    if not ready_count[topic] then
      ready_count[topic] = 0
      topics[#topics + 1] = topic
    end
    ready_count[topic] = ready_count[topic] + 1
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
