-- job.lua: the encoding of a job in the pool, shared by every script.
-- Prepended to each script at load time; defines no keys and reads no ARGV.
-- A job is stored as nine header fields and the body, joined by "\n":
--   version, state, attempts, max_attempts, ttr_ms, at_ms, lease, topic,
--   last_error, body
-- The body comes last and is never split, so it may hold any bytes; topic
-- and last_error never hold "\n". lease counts reservations: a consumer
-- proves it still holds the job by the lease it was given.
-- at_ms is the job's score in its bucket while it is there (due time when
-- delayed, lease deadline when reserved) and the time it became ready or dead
-- otherwise.

local DELAYED, READY, RESERVED, DEAD = '1', '2', '3', '4'

local function decode(v)
  local f, pos = {}, 1
  for i = 1, 9 do
    local j = string.find(v, '\n', pos, true)
    f[i] = string.sub(v, pos, j - 1)
    pos = j + 1
  end
  return {
    state = f[2],
    attempts = tonumber(f[3]),
    max = tonumber(f[4]),
    ttr = tonumber(f[5]),
    at = tonumber(f[6]),
    lease = tonumber(f[7]),
    topic = f[8],
    err = f[9],
    body = string.sub(v, pos),
  }
end

-- Numbers are whole and below 10^14 (a millisecond time until the year
-- 5138), so Lua's own number-to-string conversion writes them exactly.
local function encode(j)
  return '1\n' .. j.state .. '\n' .. j.attempts .. '\n' .. j.max .. '\n' .. j.ttr .. '\n' ..
    j.at .. '\n' .. j.lease .. '\n' .. j.topic .. '\n' .. j.err .. '\n' .. j.body
end

-- now_us returns the Redis server's clock in microseconds.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- earliest returns the lowest score of a bucket, or nil when it is empty.
local function earliest(bucket)
  local head = redis.call('ZRANGE', bucket, 0, 0, 'WITHSCORES')
  if head[2] then
    return tonumber(head[2])
  end
  return nil
end

-- due_ms returns the due time of a job delayed by delay_ms from now (in
-- microseconds), rounded up so that it is never due before the full delay.
local function due_ms(now, delay_ms)
  if delay_ms <= 0 then
    return math.floor(now / 1000)
  end
  return math.floor((now + delay_ms * 1000 + 999) / 1000)
end

-- Wake-ups go out on the bucket's own channels with the publish command the
-- caller names (pub): SPUBLISH on Redis Cluster, where the channel lives in
-- the bucket's slot and reaches only that shard, PUBLISH elsewhere.

-- wake_if_first tells the bucket's handler, in microseconds from now, when
-- a job due at at_ms became the bucket's earliest.
local function wake_if_first(bucket, pub, wake, at_ms, now)
  if earliest(bucket) == at_ms then
    redis.call(pub, wake, string.format('%d', math.max(0, at_ms * 1000 - now)))
  end
end

-- Write order. A script may write to keys it was not given in KEYS (a
-- topic's ready list or dead letters, built from a prefix). While Redis
-- Cluster migrates the bucket's slot, such a write can fail with an error
-- that ends the script half-way, keeping what it wrote so far. So every
-- script writes to such a key first, before it changes the job: a failure
-- then leaves the job as it was, or at worst leaves an extra ID in a ready
-- list, which a consumer drops when the job is not ready.

-- schedule makes a job delayed until due_ms in its bucket, waking the
-- bucket's handler when it became the earliest.
local function schedule(pool, bucket, pub, wake, id, job, due, now)
  job.state, job.at = DELAYED, due
  redis.call('HSET', pool, id, encode(job))
  redis.call('ZADD', bucket, due, id)
  wake_if_first(bucket, pub, wake, due, now)
end

-- make_ready puts a job in its topic's ready list and wakes one consumer.
local function make_ready(pool, ready_prefix, pub, ready_channel, id, job, now)
  redis.call('RPUSH', ready_prefix .. job.topic, id)
  job.state, job.at = READY, math.floor(now / 1000)
  redis.call('HSET', pool, id, encode(job))
  redis.call(pub, ready_channel .. job.topic, '1')
end

-- kill moves a job to its topic's dead letters.
local function kill(pool, dead_prefix, dead_topics, id, job, now)
  job.state, job.at = DEAD, math.floor(now / 1000)
  redis.call('ZADD', dead_prefix .. job.topic, job.at, id)
  redis.call('SADD', dead_topics, job.topic)
  redis.call('HSET', pool, id, encode(job))
end

-- held returns the job with id when it is reserved under lease; otherwise
-- nil and a status: 0 no such job, -1 the lease is gone.
local function held(pool, id, lease)
  local v = redis.call('HGET', pool, id)
  if not v then
    return nil, 0
  end
  local job = decode(v)
  if job.state ~= RESERVED or job.lease ~= lease then
    return nil, -1
  end
  return job
end
