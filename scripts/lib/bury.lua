--#include window tombstones
-- bury.lua: the tombstone (tombstones.lua) of a job that ends.

-- bury leaves the tombstone of a job, if it has a window, and deletes some
-- tombstones whose window ended.
local function bury(dedup, id, v, now_ms)
  local window = window_of(v)
  if window > 0 then
    redis.call('ZADD', dedup, now_ms + window, id)
    trim_buried(dedup, now_ms)
  end
end
