#!lua
-- renew.lua: make a grant of a limited topic (acquire.lua), handed over by
-- a job that settled, a grant for the caller's next reservation: when the
-- topic has a Concurrency and no Rate (a rate counts every reservation),
-- the grant is still held, and the grants held are within the limit.
-- Otherwise the grant is left as it is: the caller may have reserved with
-- it already, and gives it back once those jobs are released.
-- KEYS[1] limits hash  KEYS[2] the topic's grants (run zset)
-- ARGV[1] topic  ARGV[2] the grant  ARGV[3] how long it lasts until bound
-- to a job, ms
-- returns {1, deadline_ms} renewed, {0, 0} not
-- Running it twice renews twice, from the second run's time.

local limits, run = KEYS[1], KEYS[2]
local topic, member = ARGV[1], ARGV[2]
local now = floor(now_us() / 1000)
local l = redis.call('HGET', limits, topic)
local conc, rmax = 0, 1
if l then
  conc, rmax = string.match(l, '^(%d+):(%d+):')
  conc, rmax = tonumber(conc), tonumber(rmax)
end
redis.call('ZREMRANGEBYSCORE', run, '-inf', now)
local held = redis.call('ZSCORE', run, member)
if held and conc > 0 and rmax == 0 and redis.call('ZCARD', run) <= conc then
  local deadline = now + tonumber(ARGV[3])
  redis.call('ZADD', run, deadline, member)
  return {1, deadline}
end
return {0, 0}
