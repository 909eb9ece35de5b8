#!lua flags=allow-oom
--#include codec tallies window bury clock
-- finish.lua: delete reserved jobs: their work is done.
-- KEYS[1] pool hash  KEYS[2] bucket zset  KEYS[3] dedup zset  KEYS[4] counts hash
-- ARGV two values per job: job id, and the reservation the caller holds or "" for
-- any reservation
-- returns one integer per job: 1 finished, 0 no such job, -1 the job is not
-- reserved, -2 the caller's reservation is gone (the job is not reserved under it)
-- Running it twice finishes once; the second run finds no job. A consumer
-- whose reservation ran out can never bring a job back: the job is deleted or left
-- as it is. An ID given twice is finished by the first of its entries.

-- A job's answer, as settle.go reads it.
local FINISH_DONE = 1
local FINISH_NO_JOB = 0
local FINISH_NOT_RESERVED = -1
local FINISH_LOST = -2

local pool, bucket, dedup = KEYS[1], KEYS[2], KEYS[3]
local ids = {}
for i = 1, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
end
local vs = redis.call('HMGET', pool, unpack(ids))
local out, done, finished = {}, {}, {}
for i, id in ipairs(ids) do
  local reservation, v = ARGV[2 * i], vs[i]
  if not v or done[id] then
    out[i] = FINISH_NO_JOB
  else
    -- Only the header matters here: the state and the reservation.
    local state = byte(v, 1) % 8
    if reservation ~= '' and (state ~= RESERVED or read48(v, RESERVATION) ~= tonumber(reservation)) then
      out[i] = FINISH_LOST
    elseif state ~= RESERVED then
      out[i] = FINISH_NOT_RESERVED
    else
      out[i] = FINISH_DONE
      done[id] = true
      done[#done + 1] = id
      add1(finished, topic_of(v))
      if has_window(v) then -- spares the clock when there is no window
        bury(dedup, id, v, floor(now_us() / 1000))
      end
    end
  end
end
if #done > 0 then
  redis.call('HDEL', pool, unpack(done))
  redis.call('ZREM', bucket, unpack(done))
  tally_each(KEYS[4], RESERVED, finished, -1)
end
return out
