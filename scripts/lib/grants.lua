-- grants.lua: the grant of capacity (acquire.lua) a reserved job of a topic
-- with a concurrency limit holds, kept beside the job in its bucket, so
-- that a process that did not reserve the job still gives the grant back
-- when it finishes or removes the job (limits_grants.go). The key
-- "<prefix><id>" holds "<reservation>\n<grant>" and lives as long as the
-- reservation and GRANT_SLACK_MS more: a grant runs out with its
-- reservation in any case.

local GRANT_SLACK_MS = 1000

-- keep_grant records that job id, reserved under reservation for ttr_ms
-- from now, holds grant.
local function keep_grant(prefix, id, reservation, grant, ttr_ms)
  redis.call('SET', prefix .. id, string.format('%d', reservation) .. '\n' .. grant, 'PX', ttr_ms + GRANT_SLACK_MS)
end

-- take_grant returns the grant job id holds under reservation, or nil,
-- and forgets what the job held.
local function take_grant(prefix, id, reservation)
  local k = prefix .. id
  local rec = redis.call('GET', k)
  if not rec then
    return nil
  end
  redis.call('DEL', k)
  local r, grant = string.match(rec, '^(%d+)\n(.*)$')
  if tonumber(r) ~= reservation then
    return nil -- held under an earlier reservation
  end
  return grant
end
