-- dead.lua: list the oldest dead jobs of a topic in one bucket.
-- KEYS[1] dead-letter zset  KEYS[2] pool hash
-- ARGV[1] how many at most
-- returns {id1, job1, id2, job2, ...}, oldest death first

local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
local out = {}
for _, id in ipairs(ids) do
  local v = redis.call('HGET', KEYS[2], id)
  if v then
    out[#out + 1] = id
    out[#out + 1] = v
  end
end
return out
