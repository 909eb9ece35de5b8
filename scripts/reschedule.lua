#!lua
--#include decode ready delay due counts clock
-- reschedule.lua: move a pending (delayed or ready) job to a new due time.
-- KEYS[1] pool hash  KEYS[2] bucket zset  KEYS[3] ready-list key prefix  KEYS[4] counts hash
-- KEYS[5] ready-signal key prefix
-- ARGV[1] job id  ARGV[2] delay ms (-1 when ARGV[3] holds the due time)
-- ARGV[3] due ms  ARGV[4] wake channel  ARGV[5] publish command
-- returns {1, due_ms}, {0} no such job, {-1} the job is reserved or dead
-- A ready job made delayed leaves its ID in the ready list, where it is
-- dropped when popped. Running it twice sets the same due time again
-- (relative delays count from the second run).

-- The answer, first in the reply (bucket.go reads it).
local RESCHEDULE_DONE = 1
local RESCHEDULE_NO_JOB = 0
local RESCHEDULE_NOT_PENDING = -1

local pool, bucket, ready_prefix = KEYS[1], KEYS[2], KEYS[3]
local id, delay, due = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local wake, pub = ARGV[4], ARGV[5]

local v = redis.call('HGET', pool, id)
if not v then
  return {RESCHEDULE_NO_JOB}
end
local job = decode(v)
if job.state ~= DELAYED and job.state ~= READY then
  return {RESCHEDULE_NOT_PENDING}
end
local now = now_us()
if delay >= 0 then
  due = due_ms(now, delay)
end
if due <= math.floor(now / 1000) then
  if job.state == DELAYED then
    make_ready(pool, ready_prefix, KEYS[4], KEYS[5], id, job, now)
    redis.call('ZREM', bucket, id)
    tally(KEYS[4], DELAYED, job.topic, -1)
    tally(KEYS[4], READY, job.topic, 1)
  end
  return {RESCHEDULE_DONE, job.at}
end
if job.state == READY then
  tally(KEYS[4], READY, job.topic, -1)
  tally(KEYS[4], DELAYED, job.topic, 1)
end
schedule(pool, bucket, pub, wake, id, job, due, now)
return {RESCHEDULE_DONE, due}
