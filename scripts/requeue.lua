#!lua
--#include decode ready counts clock dead
-- requeue.lua: give dead jobs a new life: ready at once, with their
-- attempts reset.
-- KEYS[1] dead-letter key prefix  KEYS[2] pool hash  KEYS[3] ready-list key prefix
-- KEYS[4] dead topics set  KEYS[5] counts hash  KEYS[6] ready-signal key prefix
-- ARGV[1] batch size  ARGV[2] job id, or "" for the oldest batch of the
-- topic  ARGV[3] topic (for a job id, the one it is dead in now counts,
-- whatever the caller read)
-- returns how many jobs were requeued
-- Running it twice requeues nothing twice: a requeued job is no longer dead.

local dead_prefix, pool, ready_prefix, dead_topics = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local batch, one, topic = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local now = now_us()

-- requeue makes the dead job id, v, ready, and reports whether it was
-- dead in topic.
local function requeue(id, v)
  if not v then
    return false
  end
  local job = decode(v)
  if job.state ~= DEAD or job.topic ~= topic then
    return false
  end
  job.attempts = 0
  make_ready(pool, ready_prefix, KEYS[5], KEYS[6], id, job, now)
  return true
end

local ids, vs
if one ~= '' then
  ids, vs = {one}, {redis.call('HGET', pool, one)}
  if vs[1] then
    topic = topic_of(vs[1]) -- the caller read it before any change
  end
else
  ids = redis.call('ZRANGE', dead_prefix .. topic, 0, batch - 1)
  vs = #ids > 0 and redis.call('HMGET', pool, unpack(ids)) or {}
end
local dead, n = dead_prefix .. topic, 0
for i, id in ipairs(ids) do
  if requeue(id, vs[i]) then
    n = n + 1
  end
  redis.call('ZREM', dead, id)
end
dead_gone(dead, dead_topics, topic)
tally(KEYS[5], READY, topic, n)
return n
