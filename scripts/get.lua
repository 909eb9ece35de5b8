#!lua flags=no-writes
-- get.lua: read one job, with its score in the bucket (a delayed job's due
-- time) read at the same moment.
-- KEYS[1] pool hash  KEYS[2] bucket zset
-- ARGV[1] job id
-- returns {} when no such job, else {job, score} (score "" when the job is
-- not in the bucket)
-- Read only: it runs at maxmemory, and on a replica.

local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then
  return {}
end
return {v, redis.call('ZSCORE', KEYS[2], ARGV[1]) or ''}
