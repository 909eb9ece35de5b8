-- touch.lua: extend a reserved job's lease for long work.
-- KEYS[1] pool hash  KEYS[2] bucket zset
-- ARGV[1] job id  ARGV[2] lease  ARGV[3] extension ms (0: the job's TTR)
-- ARGV[4] wake channel  ARGV[5] publish command
-- returns {1, new lease deadline ms}, {0} no such job, {-1} the caller's
-- lease is gone
-- The lease runs until now plus the extension; running it twice does the same.

local pool, bucket, id, lease, ext = KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local job, status = held(pool, id, lease)
if not job then
  return {status}
end
if ext <= 0 then
  ext = job.ttr
end
local now = now_us()
job.at = math.floor(now / 1000) + ext
redis.call('HSET', pool, id, encode(job))
redis.call('ZADD', bucket, job.at, id)
wake_if_first(bucket, ARGV[5], ARGV[4], job.at, now)
return {1, job.at}
