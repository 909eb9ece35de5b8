-- tombstones.lua: dedup windows. A job pushed with one leaves a tombstone
-- when it is finished or removed, its ID scored by when the window ends, so
-- that a push of the same ID within the window creates nothing (push.lua).

-- trim_buried deletes up to 1,000 tombstones whose window ended: the
-- lowest scores, by rank, so that one call stays short however many wait.
local function trim_buried(dedup, now_ms)
  local n = redis.call('ZCOUNT', dedup, '-inf', now_ms)
  if n > 0 then
    redis.call('ZREMRANGEBYRANK', dedup, 0, math.min(n, 1000) - 1)
  end
end
