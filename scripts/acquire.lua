#!lua
--#include clock
-- acquire.lua: grant a consumer of a limited topic capacity to reserve up
-- to n of its jobs, within the topic's limits, counted for every process.
-- KEYS[1] limits hash  KEYS[2] the topic's grants (run zset)  KEYS[3] the
-- topic's rate log (zset)  KEYS[4] this call's record (new for every call)
-- ARGV[1] topic  ARGV[2] the call's name  ARGV[3] how many grants wanted
-- ARGV[4] how long a grant lasts until the caller binds it to a job, ms
-- ARGV[5] how long the record lives, ms
-- returns {granted, deadline_ms, wait_ms, full, rated, counted}: granted is -1 when the
-- topic has no limits; the grants are members "<call>:1".."<call>:granted"
-- of the run zset scored by deadline_ms (and of the rate log scored by now).
-- When none is granted, wait_ms is how long until capacity is due (a
-- grant's deadline or a rate entry leaving the window; -1: not known) and
-- full is 1 when Concurrency is what is used up (a release wakes the caller);
-- rated is 1 when the topic has a Rate, counted when it has a Concurrency
-- (its grants are then held until their jobs are settled).
-- A grant past its deadline is dropped: a process that died holding
-- capacity gives it back when its reservations would have run out.
-- Running it twice grants once: the second run answers from the record.

-- In place of how many were granted (limits_grants.go reads it).
local ACQUIRE_NO_LIMITS = -1

local limits, run, rate, record = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local topic, call, want, hold = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])

local rec = redis.call('GET', record)
if rec then
  local n, deadline, rated, counted = string.match(rec, '^(%d+):(%d+):(%d):(%d)$')
  return {tonumber(n), tonumber(deadline), -1, 0, tonumber(rated), tonumber(counted)}
end
local l = redis.call('HGET', limits, topic)
if not l then
  return {ACQUIRE_NO_LIMITS, 0, -1, 0, 0, 0}
end
local conc, rmax, per = string.match(l, '^(%d+):(%d+):(%d+)$')
conc, rmax, per = tonumber(conc), tonumber(rmax), tonumber(per)

local now = math.floor(now_us() / 1000)
local k, wait, full = want, -1, 0
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', run, '-inf', now)
  local free = conc - redis.call('ZCARD', run)
  if free <= 0 then
    local first = redis.call('ZRANGE', run, 0, 0, 'WITHSCORES')
    wait, full = tonumber(first[2]) - now, 1
  end
  k = math.min(k, free)
end
if rmax > 0 then
  redis.call('ZREMRANGEBYSCORE', rate, '-inf', now - per)
  local left = rmax - redis.call('ZCARD', rate)
  if left <= 0 then
    local first = redis.call('ZRANGE', rate, 0, 0, 'WITHSCORES')
    wait = math.max(wait, tonumber(first[2]) + per - now)
  end
  k = math.min(k, left)
end
local rated, counted = rmax > 0 and 1 or 0, conc > 0 and 1 or 0
if k <= 0 then
  return {0, 0, wait, full, rated, counted}
end
local deadline = now + hold
for i = 1, k do
  local member = call .. ':' .. i
  if conc > 0 then
    redis.call('ZADD', run, deadline, member)
  end
  if rmax > 0 then
    redis.call('ZADD', rate, now, member)
  end
end
if rmax > 0 then
  redis.call('PEXPIRE', rate, per + 1000)
end
redis.call('SET', record, k .. ':' .. deadline .. ':' .. rated .. ':' .. counted, 'PX', tonumber(ARGV[5]))
return {k, deadline, -1, 0, rated, counted}
