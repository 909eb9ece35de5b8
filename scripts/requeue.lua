#!lua
--#include decode ready counts clock dead
-- requeue.lua: give dead jobs of a topic a new life: ready at once, with
-- their attempts reset.
-- KEYS[1] dead-letter zset  KEYS[2] pool hash  KEYS[3] ready-list key prefix
-- KEYS[4] dead topics set  KEYS[5] counts hash  KEYS[6] ready-signal key prefix
-- ARGV[1] batch size  ARGV[2] job id, or "" for the oldest batch of the
-- topic  ARGV[3] topic
-- returns how many jobs were requeued
-- Running it twice requeues nothing twice: a requeued job is no longer dead.

local dead, pool, ready_prefix, dead_topics = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local batch, one = tonumber(ARGV[1]), ARGV[2]

local ids
if one ~= '' then
  ids = {one}
else
  ids = redis.call('ZRANGE', dead, 0, batch - 1)
end
local now, n = now_us(), 0
for _, id in ipairs(ids) do
  local v = redis.call('HGET', pool, id)
  if v then
    local job = decode(v)
    if job.state == DEAD then
      job.attempts = 0
      make_ready(pool, ready_prefix, KEYS[5], KEYS[6], id, job, now)
      n = n + 1
    end
  end
  redis.call('ZREM', dead, id)
end
dead_gone(dead, dead_topics, ARGV[3])
tally(KEYS[5], READY, ARGV[3], n)
return n
