#!lua flags=allow-oom
--#include decode counts bury clock dead grants
-- remove.lua: cancel a job in any state.
-- KEYS[1] pool hash  KEYS[2] bucket zset  KEYS[3] dead-letter key prefix
-- KEYS[4] dedup zset  KEYS[5] dead topics set  KEYS[6] counts hash
-- KEYS[7] the prefix of the jobs' grants (lib/grants.lua)
-- ARGV[1] job id
-- returns {1} removed, {0} no such job; {1, topic, grant} for a reserved
-- job whose grant was recorded, which the caller gives back
-- A ready job's ID stays in its ready list and is dropped when popped, so
-- removal costs O(log n) whatever the state.

-- The answer, as pool.go reads it.
local REMOVE_DONE = 1
local REMOVE_NO_JOB = 0

local pool, bucket, dead_prefix, dedup, dead_topics, id = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1]
local v = redis.call('HGET', pool, id)
if not v then
  return {REMOVE_NO_JOB}
end
local job = decode(v)
if job.state == DEAD then
  local dead = dead_prefix .. job.topic
  redis.call('ZREM', dead, id) -- first: see lib/ready.lua
  dead_gone(dead, dead_topics, job.topic)
end
redis.call('HDEL', pool, id)
redis.call('ZREM', bucket, id)
if job.state ~= DEAD then
  tally(KEYS[6], job.state, job.topic, -1)
end
bury(dedup, id, v, floor(now_us() / 1000))
local grant = job.state == RESERVED and take_grant(KEYS[7], id, job.reservation)
if grant then
  return {REMOVE_DONE, job.topic, grant}
end
return {REMOVE_DONE}
