#!lua flags=no-writes
--#include clock
-- usage.lua: how much of a limited topic's limits is in use, on the
-- server's clock, which the grants' times are on (acquire.lua).
-- KEYS[1] the topic's grants (run zset)  KEYS[2] the topic's rate log
-- ARGV[1] the limits' Per, ms
-- returns {grants held, grants given in the last Per}

local now = math.floor(now_us() / 1000)
return {redis.call('ZCOUNT', KEYS[1], now, '+inf'),
  redis.call('ZCOUNT', KEYS[2], '(' .. (now - tonumber(ARGV[1])), '+inf')}
