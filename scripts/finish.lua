#!lua flags=allow-oom
--#include finish
-- finish.lua: delete reserved jobs: their work is done (lib/finish.lua).
-- KEYS[1] pool hash  KEYS[2] bucket zset  KEYS[3] dedup zset  KEYS[4] counts hash
-- ARGV two values per job: job id, and the reservation the caller holds or "" for
-- any reservation
-- returns one integer per job: 1 finished, 0 no such job, -1 the job is not
-- reserved, -2 the caller's reservation is gone (the job is not reserved under it)
-- A consumer whose reservation ran out can never bring a job back: the job
-- is deleted or left as it is.

return finish_jobs(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV, 1, #ARGV)
