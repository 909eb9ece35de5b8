#!lua flags=allow-oom
--#include decode bury clock dead
-- purge.lua: delete dead jobs of a topic that died at least an age ago.
-- KEYS[1] dead-letter zset  KEYS[2] pool hash  KEYS[3] dead topics set
-- KEYS[4] dedup zset
-- ARGV[1] topic  ARGV[2] minimum age ms (0: every dead job)  ARGV[3] batch size
-- returns how many jobs were deleted; fewer than the batch means done
-- Running it twice deletes nothing twice.

local dead, pool, dead_topics, dedup = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local age, batch = tonumber(ARGV[2]), tonumber(ARGV[3])
local now_ms = floor(now_us() / 1000)
local cutoff = now_ms - age
local ids = redis.call('ZRANGEBYSCORE', dead, '-inf', cutoff, 'LIMIT', 0, batch)
for _, id in ipairs(ids) do
  local v = redis.call('HGET', pool, id)
  if v and decode(v).state == DEAD then
    redis.call('HDEL', pool, id)
    bury(dedup, id, v, now_ms)
  end
end
if #ids > 0 then
  redis.call('ZREM', dead, unpack(ids))
end
dead_gone(dead, dead_topics, ARGV[1])
return #ids
