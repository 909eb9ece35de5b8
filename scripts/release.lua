#!lua flags=allow-oom
--#include held ready counts clock
-- release.lua: give a reserved job back to its ready list at once, as a
-- consumer that stops does; the attempt does not count.
-- KEYS[1] pool hash  KEYS[2] bucket zset  KEYS[3] ready-list key prefix
-- KEYS[4] counts hash  KEYS[5] ready-signal key prefix
-- ARGV[1] job id  ARGV[2] reservation
-- returns 1 released, 0 no such job, -1 the caller's reservation is gone
-- Running it twice releases once: the second run finds the reservation gone.

local pool, bucket, ready_prefix = KEYS[1], KEYS[2], KEYS[3]
local RELEASE_DONE = 1 -- or held's status
local id, reservation = ARGV[1], tonumber(ARGV[2])
local job, status = held(pool, id, reservation)
if not job then
  return status
end
job.attempts = job.attempts - 1
make_ready(pool, ready_prefix, KEYS[4], KEYS[5], id, job, now_us())
redis.call('ZREM', bucket, id)
tally(KEYS[4], RESERVED, job.topic, -1)
tally(KEYS[4], READY, job.topic, 1)
return RELEASE_DONE
