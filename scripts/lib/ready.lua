--#include decode places signals
-- ready.lua: making a job ready.
-- Write order. A script may write to keys it was not given in KEYS (a
-- topic's ready list or dead letters, built from a prefix). While Redis
-- Cluster migrates the bucket's slot, such a write can fail with an error
-- that ends the script half-way, keeping what it wrote so far. So every
-- script writes to such a key first, before it changes the job: a failure
-- then leaves the job as it was, or at worst leaves an extra ID in a ready
-- list, which a consumer drops when the job is not ready.

-- make_ready puts a job in its topic's ready list, at the place it keeps,
-- and signals it.
local function make_ready(pool, ready_prefix, counts, sig_prefix, id, job, now)
  local len = redis.call('RPUSH', ready_prefix .. job.topic, id)
  job.state, job.at = READY, math.floor(now / 1000)
  job.reservation = placed(counts, job.topic, 1, len)
  redis.call('HSET', pool, id, encode(job))
  signal(sig_prefix, job.topic, 1)
end
