-- clock.lua: the Redis server's clock, the one every process shares.

-- now_us returns the Redis server's clock in microseconds.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
