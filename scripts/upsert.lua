#!lua
--#include codec header places due counts clock wake signals dead grants
-- upsert.lua: create a job, or replace the job with its ID whatever its
-- state, as if pushed anew: body, topic, TTR, max attempts and due time become the
-- new job's; attempts and last error start over. An explicit write: a
-- tombstone of the ID (its dedup window) is cleared, not obeyed.
-- KEYS[1] pool hash  KEYS[2] bucket zset  KEYS[3] ready-list key prefix of the bucket
-- KEYS[4] dedup zset  KEYS[5] counts hash  KEYS[6] ready-signal key prefix
-- KEYS[7] dead-letter key prefix  KEYS[8] topics with dead letters
-- KEYS[9] the prefix of the jobs' grants (lib/grants.lua)
-- ARGV[1] wake channel  ARGV[2] publish command
-- ARGV[3] id  ARGV[4] delay ms ("" when the job's at_ms holds its due time)
-- ARGV[5] the job encoded as a delayed job (lib/codec.lua)
-- returns {1} created, {0} replaced; {0, topic, grant} when it replaced a
-- reserved job whose grant was recorded, which the caller gives back
-- A reserved job's reservation ends (its consumer's Finish, Retry and
-- Touch find it gone), and the new job is what comes next. A dead job
-- leaves its dead letters as a new job.
-- Running it twice replaces twice with the same job: the outcome is the
-- same, but a second run reports {0}.

-- The answer, first in the reply (push.go reads it).
local UPSERT_CREATED = 1
local UPSERT_REPLACED = 0

local pool, bucket, ready_prefix, dedup = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local wake, pub = ARGV[1], ARGV[2]
local id, delay, v = ARGV[3], ARGV[4], ARGV[5]

local topic = topic_of(v)
local cur = redis.call('HGET', pool, id)
local was_ready, grant = false, nil
if cur then
  local state = byte(cur, 1) % 8
  if state == RESERVED then
    grant = take_grant(KEYS[9], id, read48(cur, RESERVATION))
  end
  was_ready = state == READY and topic_of(cur) == topic
  if state == DEAD then
    local dead = KEYS[7] .. topic_of(cur)
    redis.call('ZREM', dead, id) -- first: see lib/ready.lua
    dead_gone(dead, KEYS[8], topic_of(cur))
  else
    tally(KEYS[5], state, topic_of(cur), -1)
  end
end
local now = now_us()
local now_ms = floor(now / 1000)
local due = pushed_due(now, delay, v)
redis.call('ZREM', dedup, id)
if due <= now_ms then
  -- Ready now. A job that was ready in the same topic keeps its place in
  -- the list; otherwise the ID joins the list, and an entry it left in
  -- another list is dropped by the consumer that meets it.
  local place
  if was_ready then
    place = read48(cur, RESERVATION)
  else
    place = placed(KEYS[5], topic, 1, redis.call('RPUSH', ready_prefix .. topic, id))
  end
  redis.call('HSET', pool, id, restate(v, READY, now_ms, nil, place))
  redis.call('ZREM', bucket, id) -- its due time, or its reservation's deadline
  if not was_ready then
    signal(KEYS[6], topic, 1)
  end
  tally(KEYS[5], READY, topic, 1)
else
  redis.call('HSET', pool, id, v)
  redis.call('ZADD', bucket, due, id)
  wake_if_first(bucket, pub, wake, due, now)
  tally(KEYS[5], DELAYED, topic, 1)
end
if grant then
  return {UPSERT_REPLACED, topic_of(cur), grant}
elseif cur then
  return {UPSERT_REPLACED}
end
return {UPSERT_CREATED}
