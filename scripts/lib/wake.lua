--#include bucket
-- wake.lua: telling a bucket's handler when its earliest job is due.
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
