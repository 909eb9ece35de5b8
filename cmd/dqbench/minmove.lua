-- minmove.lua: the baseline's mover: move due members of its zset to its list.
-- KEYS[1] zset of members scored by due time (Unix ms)  KEYS[2] list consumers pop
-- ARGV[1] most members to move
-- returns {moved, ms until the next member is due, or -1 when none is left}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
if #due > 0 then
  redis.call('RPUSH', KEYS[2], unpack(due))
  redis.call('ZREM', KEYS[1], unpack(due))
end
local next = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #next == 0 then
  return {#due, -1}
end
return {#due, math.max(0, tonumber(next[2]) - now)}
