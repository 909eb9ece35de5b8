#!lua flags=allow-oom
--#include decode clock grants
-- touch.lua: extend the reservations of reserved jobs for long work: each
-- runs its job's TTR from now. A reservation whose deadline passed is not
-- extended, even before the bucket's handler moves the job back.
-- KEYS[1] pool hash  KEYS[2] bucket zset  KEYS[3] the prefix of the jobs'
-- grants (lib/grants.lua)
-- ARGV three values per job: job id, the reservation the caller holds, and
-- "1" when it holds the job's grant, whose record then lasts as long, or ""
-- returns one integer per job: the new reservation deadline ms, 0 no such job,
-- -1 the caller's reservation is gone
-- A deadline only moves later, so the bucket's handler needs no wake-up.
-- Running it twice extends from the second run's time.

-- A job's answer when it is not its new deadline, as settle_keep.go reads it.
local TOUCH_NO_JOB = 0
local TOUCH_LOST = -1

local pool, bucket = KEYS[1], KEYS[2]
local ids = {}
for i = 1, #ARGV, 3 do
  ids[#ids + 1] = ARGV[i]
end
local vs = redis.call('HMGET', pool, unpack(ids))
local now_ms = floor(now_us() / 1000)
local out, fields, scores = {}, {}, {}
for i, id in ipairs(ids) do
  local v = vs[i]
  if not v then
    out[i] = TOUCH_NO_JOB
  else
    local job = decode(v)
    if job.state ~= RESERVED or job.reservation ~= tonumber(ARGV[3 * i - 1]) or job.at <= now_ms then
      -- Gone, or run out: the bucket's handler may hand it to another
      -- consumer at any moment, and its grant may be gone already.
      out[i] = TOUCH_LOST
    else
      job.at = now_ms + job.ttr
      fields[#fields + 1] = id
      fields[#fields + 1] = encode(job)
      scores[#scores + 1] = job.at
      scores[#scores + 1] = id
      out[i] = job.at
      if ARGV[3 * i] == '1' then
        redis.call('PEXPIRE', KEYS[3] .. id, job.ttr + GRANT_SLACK_MS)
      end
    end
  end
end
if #fields > 0 then
  redis.call('HSET', pool, unpack(fields))
  redis.call('ZADD', bucket, unpack(scores))
end
return out
