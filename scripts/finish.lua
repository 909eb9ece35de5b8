#!lua flags=allow-oom
--#include finish
-- finish.lua: delete reserved jobs: their work is done (lib/finish.lua).
-- KEYS[1] pool hash  KEYS[2] bucket zset  KEYS[3] dedup zset  KEYS[4] counts hash
-- KEYS[5] the prefix of the jobs' grants (lib/grants.lua)
-- ARGV three values per job: job id, the reservation the caller holds or
-- "" for any reservation, and "1" when the caller holds its grant or ""
-- returns one integer per job: 1 finished, 0 no such job, -1 the job is not
-- reserved, -2 the caller's reservation is gone (the job is not reserved
-- under it); then, for each job finished for any reservation whose grant
-- was recorded, its place among those integers (from 1), its topic and its
-- grant, for the caller to give back
-- A consumer whose reservation ran out can never bring a job back: the job
-- is deleted or left as it is.

local out, taken = finish_jobs(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV, 1, #ARGV)
for _, t in ipairs(taken) do
  out[#out + 1] = t
end
return out
