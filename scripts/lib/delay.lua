--#include decode wake
-- delay.lua: making a job delayed.

-- schedule makes a job delayed until due_ms in its bucket, waking the
-- bucket's handler when it became the earliest.
local function schedule(pool, bucket, pub, wake, id, job, due, now)
  job.state, job.at = DELAYED, due
  redis.call('HSET', pool, id, encode(job))
  redis.call('ZADD', bucket, due, id)
  wake_if_first(bucket, pub, wake, due, now)
end
