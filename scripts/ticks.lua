#!lua flags=no-writes
--#include clock
-- ticks.lua: the schedules of one bucket whose next tick came.
-- KEYS[1] ticks zset  KEYS[2] schedules hash  KEYS[3] watched string
-- ARGV[1] how many schedules at most
-- returns {now_ms, next_tick_ms or -1, watched_since_ms, name, definition,
-- tick_ms, ...}: the server's clock, the earliest tick still to come, since
-- when started processes have watched the bucket with no gap (move.lua;
-- now_ms when none vouches for now), and each schedule
-- whose next tick is due (at most ARGV[1], earliest first) with its
-- definition and that tick.

local ticks, schedules = KEYS[1], KEYS[2]
local now_ms = math.floor(now_us() / 1000)
local due = redis.call('ZRANGEBYSCORE', ticks, '-inf', now_ms, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
local after = redis.call('ZRANGEBYSCORE', ticks, '(' .. now_ms, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local out = {now_ms, -1, now_ms}
local since, till = string.match(redis.call('GET', KEYS[3]) or '', '^(%d+) (%d+)$')
if till and tonumber(till) >= now_ms then
  out[3] = math.min(tonumber(since), now_ms)
end
if after[2] then
  out[2] = tonumber(after[2])
end
if #due == 0 then
  return out
end
local names = {}
for i = 1, #due, 2 do
  names[#names + 1] = due[i]
end
local defs = redis.call('HMGET', schedules, unpack(names))
for k, name in ipairs(names) do
  if defs[k] then
    out[#out + 1] = name
    out[#out + 1] = defs[k]
    out[#out + 1] = tonumber(due[2 * k])
  end
end
return out
