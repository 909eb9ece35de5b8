-- finish.lua: delete a reserved job: its work is done.
-- KEYS[1] pool hash  KEYS[2] bucket zset
-- ARGV[1] job id  ARGV[2] lease the caller holds, or "" for any reservation
-- returns 1 finished, 0 no such job, -1 the job is not reserved, -2 the
-- caller's lease is gone (the job is not reserved under it)
-- Running it twice finishes once; the second run finds no job. A consumer
-- whose lease ran out can never bring a job back: the job is deleted or left
-- as it is.

local pool, bucket, id, lease = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local v = redis.call('HGET', pool, id)
if not v then
  return 0
end
local job = decode(v)
if lease ~= '' and (job.state ~= RESERVED or job.lease ~= tonumber(lease)) then
  return -2
end
if job.state ~= RESERVED then
  return -1
end
redis.call('HDEL', pool, id)
redis.call('ZREM', bucket, id)
return 1
