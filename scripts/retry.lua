#!lua flags=allow-oom
--#include held ready delay kill due counts clock
-- retry.lua: a consumer failed a reserved job: deliver it again after a
-- delay, or move it to the dead letters when its attempts ran out. Or, as
-- the handler asked: to the dead letters now ("dead"), or back after the
-- delay without counting the attempt ("snooze").
-- KEYS[1] pool hash  KEYS[2] bucket zset  KEYS[3] ready-list key prefix
-- KEYS[4] dead-letter key prefix  KEYS[5] dead topics set  KEYS[6] counts hash
-- KEYS[7] ready-signal key prefix
-- ARGV[1] job id  ARGV[2] reservation  ARGV[3] delay ms  ARGV[4] error text
-- ARGV[5] wake channel  ARGV[6] publish command
-- ARGV[7] mode: "retry", "dead" or "snooze" (the error text is then kept)
-- returns {1, due_ms} delayed, {2} dead, {0} no such job,
-- {-1} the caller's reservation is gone (the job is not reserved under it)
-- Running it twice retries once: the second run finds the reservation gone.

local pool, bucket, ready_prefix, dead_prefix, dead_topics = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id, reservation, delay = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local wake, pub = ARGV[5], ARGV[6]

local mode = ARGV[7]
-- The answer, first in the reply (settle_retry.go reads it), or held's status.
local RETRY_AGAIN = 1
local RETRY_DIED = 2
local job, status = held(pool, id, reservation)
if not job then
  return {status}
end
if mode == 'snooze' then
  job.attempts = math.max(job.attempts - 1, 0)
else
  job.err = ARGV[4]
end
tally(KEYS[6], RESERVED, job.topic, -1)
local now = now_us()
if mode == 'dead' or (mode ~= 'snooze' and job.attempts >= job.max) then
  kill(pool, dead_prefix, dead_topics, id, job, now)
  redis.call('ZREM', bucket, id)
  return {RETRY_DIED}
end
local due = due_ms(now, delay)
if delay <= 0 then
  make_ready(pool, ready_prefix, KEYS[6], KEYS[7], id, job, now)
  redis.call('ZREM', bucket, id)
  tally(KEYS[6], READY, job.topic, 1)
  return {RETRY_AGAIN, due}
end
schedule(pool, bucket, pub, wake, id, job, due, now)
tally(KEYS[6], DELAYED, job.topic, 1)
return {RETRY_AGAIN, due}
