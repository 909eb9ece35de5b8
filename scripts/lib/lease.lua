-- lease.lua: a bucket's leases (lock.go). The lock holds "<token> <lease
-- ms>", and the standby lease "<token> <lease ms> <next look ms>": from a
-- lease's time to live one tells how long ago its owner last renewed it,
-- whatever lease the owner has; the next look is when (server ms) the
-- standby said it would look again. An older version's standby lease
-- holds the token alone.

-- owner returns the token that holds lease value v (nil: none).
local function owner(v)
  return v and string.match(v, '^%S+')
end

-- lease_of returns lease value v's ms (nil when it holds a token alone)
-- and its next look (nil: not said).
local function lease_of(v)
  local _, ms, look_at = string.match(v, '^(%S+) (%d+) ?(%d*)$')
  return tonumber(ms), tonumber(look_at)
end
