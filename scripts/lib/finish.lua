--#include codec tallies window bury clock grants
-- finish.lua: deleting reserved jobs whose work is done (scripts/finish.lua),
-- alone or with the reserve call of their bucket (reserve.lua).

-- A job's answer, as settle.go reads it.
local FINISH_DONE = 1
local FINISH_NO_JOB = 0
local FINISH_NOT_RESERVED = -1
local FINISH_LOST = -2

-- finish_jobs finishes the jobs given as triples in args[from..to] (the
-- script's ARGV): a job ID, the reservation the caller holds or "" for
-- any reservation, and "1" when the caller holds the job's grant (a
-- grant is recorded, lib/grants.lua) or "". It returns one answer per job:
-- 1 finished, 0 no such job, -1 the job is not reserved, -2 the caller's
-- reservation is gone (the job is not reserved under it); and the grants
-- of the jobs finished for any reservation, which the caller gives back:
-- triples of the job's place among the answers, its topic and its grant.
-- Running it twice finishes once; the second run finds no job. An ID
-- given twice is finished by the first of its entries.
local function finish_jobs(pool, bucket, dedup, counts, grants, args, from, to)
  local ids = {}
  for i = from, to, 3 do
    ids[#ids + 1] = args[i]
  end
  if #ids == 0 then
    return {}, {}
  end
  local vs = redis.call('HMGET', pool, unpack(ids))
  local out, done, finished, taken = {}, {}, {}, {}
  for i, id in ipairs(ids) do
    local reservation, v = args[from + 3 * i - 2], vs[i]
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
        local topic = topic_of(v)
        add1(finished, topic)
        if reservation == '' then
          local grant = take_grant(grants, id, read48(v, RESERVATION))
          if grant then
            taken[#taken + 1], taken[#taken + 2], taken[#taken + 3] = i, topic, grant
          end
        elseif args[from + 3 * i - 1] == '1' then
          redis.call('DEL', grants .. id)
        end
        if has_window(v) then -- spares the clock when there is no window
          bury(dedup, id, v, floor(now_us() / 1000))
        end
      end
    end
  end
  if #done > 0 then
    redis.call('HDEL', pool, unpack(done))
    redis.call('ZREM', bucket, unpack(done))
    tally_each(counts, RESERVED, finished, -1)
  end
  return out, taken
end
