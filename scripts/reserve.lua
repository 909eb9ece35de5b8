-- reserve.lua: pop one ready job of a topic from one bucket and reserve it.
-- KEYS[1] ready list  KEYS[2] pool hash  KEYS[3] bucket zset  KEYS[4] lease counter
-- ARGV[1] wake channel  ARGV[2] publish command  ARGV[3] how many stale IDs to skip
-- ARGV[4] the list's topic
-- returns {1, id, job} when a job was reserved, {0} when the list is empty,
-- {2} when only stale IDs were found and the list may hold more.
-- An ID whose job was removed, is no longer ready, or is now a job of
-- another topic (removed and pushed again) is dropped: it is the trace of a
-- job that left the ready state without leaving the list.
-- Each reservation takes a new number from the bucket's counter as its
-- lease, so no two reservations of one ID, even of a job removed and pushed
-- again, ever share a lease.
-- The reservation lasts the job's TTR: the job waits in the bucket, scored by
-- its lease deadline, and is moved back to ready if not finished by then.
-- Running it twice reserves a second job; the first comes back after its TTR.

local ready, pool, bucket, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local wake, pub, skips, topic = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]

local now
for _ = 1, skips do
  local id = redis.call('LPOP', ready)
  if not id then
    return {0}
  end
  local v = redis.call('HGET', pool, id)
  if v then
    local job = decode(v)
    if job.state == READY and job.topic == topic then
      now = now_us()
      job.state = RESERVED
      job.attempts = job.attempts + 1
      job.lease = redis.call('INCR', leases)
      job.at = math.floor(now / 1000) + job.ttr
      local enc = encode(job)
      redis.call('HSET', pool, id, enc)
      redis.call('ZADD', bucket, job.at, id)
      wake_if_first(bucket, pub, wake, job.at, now)
      return {1, id, enc}
    end
  end
end
return {2}
