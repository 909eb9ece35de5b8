-- finish.lua: delete a reserved job: its work is done.
-- KEYS[1] pool hash  KEYS[2] bucket zset
-- ARGV[1] job id
-- returns 1 finished, 0 no such job, -1 the job is not reserved
-- Running it twice finishes once; the second run finds no job.

local pool, bucket, id = KEYS[1], KEYS[2], ARGV[1]
local v = redis.call('HGET', pool, id)
if not v then
  return 0
end
if decode(v).state ~= RESERVED then
  return -1
end
redis.call('HDEL', pool, id)
redis.call('ZREM', bucket, id)
return 1
