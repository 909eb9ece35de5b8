#!lua flags=allow-oom
-- giveback.lua: settle grants of a limited topic (acquire.lua): give back
-- the capacity of grants no job used and of jobs settled, and move the
-- deadline of grants whose jobs' reservations run longer.
-- KEYS[1] the topic's grants (run zset)  KEYS[2] the topic's rate log
-- KEYS[3] the topic's capacity wake-ups (list)  KEYS[4..] records of
-- answered acquire calls, to delete
-- ARGV[1] how many unused grants follow (they leave the rate log too: a
-- rate counts reservations)  ARGV[2] how many grants of settled jobs
-- follow them  then the grants, then pairs of grant and new deadline ms
-- returns how many grants were given back
-- Each grant given back pushes one wake-up, which one blocked consumer
-- takes (BLPOP); the list keeps those of the last call, and at least 16,
-- for consumers about to block.
-- Running it twice gives back nothing more.

local run, rate, free = KEYS[1], KEYS[2], KEYS[3]
local unused, settled = tonumber(ARGV[1]), tonumber(ARGV[2])
local freed = 0
if #KEYS > 3 then
  redis.call('DEL', unpack(KEYS, 4))
end
for i = 3, 2 + unused + settled do
  freed = freed + redis.call('ZREM', run, ARGV[i])
  if i < 3 + unused then
    freed = freed + redis.call('ZREM', rate, ARGV[i])
  end
end
for i = 3 + unused + settled, #ARGV, 2 do
  redis.call('ZADD', run, 'XX', ARGV[i + 1], ARGV[i])
end
if freed > 0 then
  local ones = {}
  for i = 1, freed do
    ones[i] = '1'
  end
  redis.call('RPUSH', free, unpack(ones))
  redis.call('LTRIM', free, -math.max(freed, 16), -1)
  redis.call('PEXPIRE', free, 10000)
end
return freed
