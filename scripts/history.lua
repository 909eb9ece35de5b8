#!lua
--#include clock
-- history.lua: the queue's history of figures (history.go), in two modes.
-- "flush": add one started process's tallies to the queue's, and claim
-- the sample of the current interval for that process: one claim per
-- interval however many processes call.
-- KEYS[1] tallies hash  KEYS[2] latest-sample string
-- ARGV[1] "flush"  ARGV[2] interval ms  ARGV[3] how long the keys live (ms)
-- ARGV[4] how long a quiet queue goes unsampled (ms): while no started
-- process reserved, finished or buried a job since the last sample, no
-- interval is claimed until this long after it
-- ARGV[5..] per topic: topic, finished, died, reservations, lateness sum
-- ms, lateness max ms
-- returns {now_ms, the previous sample's ms (0: none) or -1 when the
-- interval's sample is claimed already or the queue is quiet, {field,
-- value, ...}, when a quiet queue's sample is due (ms; 0: not quiet)}:
-- the tallies, taken out of the hash, go to the caller that claims.
-- "write": append one point to each series, keeping the last ARGV[2].
-- KEYS[1..] series lists
-- ARGV[1] "write"  ARGV[2] points kept  ARGV[3] how long a series lives
-- (ms)  ARGV[4..] one point per key
-- returns how many points it appended

local mode, life = ARGV[1], tonumber(ARGV[3])
if mode == 'write' then
  local keep = tonumber(ARGV[2])
  for i, key in ipairs(KEYS) do
    redis.call('RPUSH', key, ARGV[3 + i])
    redis.call('LTRIM', key, -keep, -1)
    redis.call('PEXPIRE', key, life)
  end
  return #KEYS
end

local tallies, latest, every = KEYS[1], KEYS[2], tonumber(ARGV[2])
for i = 5, #ARGV, 6 do
  local topic = ARGV[i]
  for j, field in ipairs({'f:', 'k:', 'n:', 's:'}) do
    local n = tonumber(ARGV[i + j])
    if n > 0 then
      redis.call('HINCRBY', tallies, field .. topic, n)
    end
  end
  local most = tonumber(ARGV[i + 5])
  if most > tonumber(redis.call('HGET', tallies, 'm:' .. topic) or '0') then
    redis.call('HSET', tallies, 'm:' .. topic, most)
  end
end
if #ARGV >= 5 then
  redis.call('PEXPIRE', tallies, life)
end
local now_ms = math.floor(now_us() / 1000)
local prev = tonumber(redis.call('GET', latest) or '0')
local quiet = tonumber(ARGV[4])
if prev > 0 and now_ms - prev < quiet and redis.call('EXISTS', tallies) == 0 then
  return {now_ms, -1, {}, prev + quiet} -- quiet: the counts can wait
end
if prev >= now_ms - now_ms % every then
  return {now_ms, -1, {}, 0}
end
redis.call('SET', latest, now_ms, 'PX', life)
local taken = redis.call('HGETALL', tallies)
redis.call('DEL', tallies)
return {now_ms, prev, taken, 0}
