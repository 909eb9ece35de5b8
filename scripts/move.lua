#!lua flags=allow-oom
-- move.lua: move due job IDs of one bucket to their topics' ready lists.
-- Holds the bucket's lease while it works: the caller's token takes a free
-- lease or extends its own; a lease held by another token moves nothing.
-- KEYS[1] bucket zset  KEYS[2] pool hash  KEYS[3] ready-list key prefix
-- KEYS[4] dead-letter key prefix  KEYS[5] lease lock  KEYS[6] dead topics set
-- KEYS[7] dedup zset  KEYS[8] counts hash
-- ARGV[1] lease token  ARGV[2] lease ms  ARGV[3] batch size
-- ARGV[4] ready channel prefix  ARGV[5] publish command  ARGV[6] the caller's
-- number for this call  ARGV[7] 1 to delete (up to 1,000) tombstones whose
-- dedup window ended, and the counts that are 0 or start over (job.lua), else 0
-- returns {moved, next_due_in_us or -1, mark, fresh, topic, count, topic,
-- count, ...} with how many jobs became ready per topic, fresh being 1 when
-- the call took a free lease (0 when it extended its own), or
-- {-1, lease_ttl_ms} when another token holds the lease.
-- The ready wake-ups carry a mark of this run ("count:mark", the mark being
-- "token:number:server time in us"), so that the process that moved the
-- jobs, which wakes its own consumers from the reply, can skip its own
-- message; a run whose reply was lost (go-redis re-sends the call, which
-- then moves nothing) has a mark of its own, and its message still wakes.
-- A due delayed job becomes ready; an expired reservation becomes ready again,
-- or dead when its attempts ran out. Running it twice moves nothing twice:
-- every moved ID leaves the bucket in the same call. An ID whose job is no
-- longer delayed or reserved (a call that failed half-way moved it) just
-- leaves the bucket.

local bucket, pool, ready_prefix, dead_prefix, lock, dead_topics = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local token, lease, batch = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local ready_channel, pub, call, trim = ARGV[4], ARGV[5], ARGV[6], ARGV[7]

local holder = redis.call('GET', lock)
local fresh = 0
if holder == false then
  redis.call('SET', lock, token, 'PX', lease)
  fresh = 1
elseif holder == token then
  redis.call('PEXPIRE', lock, lease)
else
  return {-1, redis.call('PTTL', lock)}
end

local now = now_us()
local now_ms = math.floor(now / 1000)
local mark = token .. ':' .. call .. ':' .. string.format('%d', now)
if trim == '1' then
  trim_buried(KEYS[7], now_ms)
  drop_zeros(KEYS[8])
end
-- A job's score is when it was due (or its reservation ran out): a ready
-- job's at_ms keeps it, so that its delivery's lateness can be told.
local scored = redis.call('ZRANGEBYSCORE', bucket, '-inf', now_ms, 'WITHSCORES', 'LIMIT', 0, batch)
local ids, dues = {}, {}
for i = 1, #scored, 2 do
  ids[#ids + 1], dues[#dues + 1] = scored[i], floor(tonumber(scored[i + 1]))
end
local lists, topics, fields = {}, {}, {}
local readied = {} -- topic -> per id of its list: the job (decoded) or encoded job, and its due time
local left = {[DELAYED] = {}, [RESERVED] = {}} -- state -> topic -> jobs that left it

if #ids > 0 then
  local vs = redis.call('HMGET', pool, unpack(ids))
  for k, id in ipairs(ids) do
    local v = vs[k]
    local state = v and byte(v, 1) % 8
    if state == RESERVED or state == DELAYED then
      local job, topic
      if state == RESERVED then
        job = decode(v)
        job.err = 'reservation ran out (TTR ' .. string.format('%d', job.ttr) .. ' ms)'
      end
      if job and job.attempts >= job.max then
        add1(left[RESERVED], job.topic)
        kill(pool, dead_prefix, dead_topics, id, job, now)
      else
        topic = job and job.topic or topic_of(v)
        add1(left[state], topic)
        group(lists, topics, topic, id)
        group(readied, nil, topic, job or v)
        group(readied, nil, topic, dues[k])
      end
    end
  end
  -- The ready lists first: see job.lua. Each job is stored with its
  -- entry's place, known once its list took the ids.
  for _, topic in ipairs(topics) do
    local place = placed(KEYS[8], topic, #lists[topic], in_chunks('RPUSH', ready_prefix .. topic, lists[topic]))
    local r = readied[topic]
    for i = 1, #lists[topic] do
      local job, due, v = r[2 * i - 1], r[2 * i], nil
      if type(job) == 'table' then
        job.state, job.at, job.reservation = READY, due, place + i - 1
        v = encode(job)
      else
        v = restate(job, READY, due, nil, place + i - 1)
      end
      fields[#fields + 1] = lists[topic][i]
      fields[#fields + 1] = v
    end
  end
  if #fields > 0 then
    in_chunks('HSET', pool, fields)
  end
  -- The IDs are the bucket's lowest: removing them by rank costs one walk
  -- of the skiplist, not one per ID (ZREM), whatever the bucket holds.
  redis.call('ZREMRANGEBYRANK', bucket, 0, #ids - 1)
  tally_each(KEYS[8], DELAYED, left[DELAYED], -1)
  tally_each(KEYS[8], RESERVED, left[RESERVED], -1)
end
-- Wake as many consumers of each topic as jobs became ready.
local out = {#ids, -1, mark, fresh}
for _, topic in ipairs(topics) do
  tally(KEYS[8], READY, topic, #lists[topic])
  redis.call(pub, ready_channel .. topic, #lists[topic] .. ':' .. mark)
  out[#out + 1] = topic
  out[#out + 1] = #lists[topic]
end

local next_due = earliest(bucket)
if next_due ~= nil then
  out[2] = math.max(0, next_due * 1000 - now)
end
return out
