#!lua
--#include clock
-- renew.lua: make grants of a limited topic (acquire.lua), handed over by
-- jobs that settled, grants for the caller's next reservations: when the
-- topic has a Concurrency and no Rate (a rate counts every reservation),
-- the grant is still held, and the grants held are within the limit.
-- Otherwise a grant is left as it is: the caller may have reserved with
-- it already, and gives it back once those jobs are released.
-- KEYS[1] limits hash  KEYS[2] the topic's grants (run zset)
-- ARGV[1] topic  ARGV[2] how long they last until bound to a job, ms
-- ARGV[3..] the grants
-- returns {deadline_ms, r, r, ...}: r is 1 for each grant renewed (until
-- deadline_ms), 0 for one not
-- Running it twice renews twice, from the second run's time.

-- A grant's answer, as limits_grants.go reads it.
local RENEW_DONE = 1
local RENEW_KEPT = 0

local limits, run = KEYS[1], KEYS[2]
local topic = ARGV[1]
local now = math.floor(now_us() / 1000)
local l = redis.call('HGET', limits, topic)
local conc, rmax = 0, 1
if l then
  conc, rmax = string.match(l, '^(%d+):(%d+):')
  conc, rmax = tonumber(conc), tonumber(rmax)
end
redis.call('ZREMRANGEBYSCORE', run, '-inf', now)
local within = conc > 0 and rmax == 0 and redis.call('ZCARD', run) <= conc
local deadline = now + tonumber(ARGV[2])
local out = {deadline}
for i = 3, #ARGV do
  local r = RENEW_KEPT
  if within and redis.call('ZSCORE', run, ARGV[i]) then
    redis.call('ZADD', run, deadline, ARGV[i])
    r = RENEW_DONE
  end
  out[#out + 1] = r
end
return out
