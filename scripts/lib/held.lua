--#include decode
-- held.lua: a reserved job, checked against the reservation its consumer
-- holds.

-- held's statuses, as settle.go reads them (reservationResult).
local HELD_NO_JOB = 0 -- no such job
local HELD_LOST = -1 -- the caller's reservation is gone

-- held returns the job with id when it is reserved under reservation;
-- otherwise nil and HELD_NO_JOB or HELD_LOST.
local function held(pool, id, reservation)
  local v = redis.call('HGET', pool, id)
  if not v then
    return nil, HELD_NO_JOB
  end
  local job = decode(v)
  if job.state ~= RESERVED or job.reservation ~= reservation then
    return nil, HELD_LOST
  end
  return job
end
