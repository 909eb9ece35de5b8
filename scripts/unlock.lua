#!lua flags=allow-oom
--#include lease
-- unlock.lua: give up a bucket's leases that the caller holds: the lease
-- (and then tell the standby, which takes the bucket over at once) and the
-- standby leases.
-- KEYS[1] lease lock  KEYS[2] standby lease  KEYS[3] second standby lease
-- ARGV[1] lease token  ARGV[2] wake channel  ARGV[3] publish command
-- returns 1 when the lease was released, 0 when this token did not hold it

-- The answer, as lock.go reads it.
local UNLOCK_RELEASED = 1
local UNLOCK_NOT_HELD = 0

for i = 2, 3 do
  if owner(redis.call('GET', KEYS[i])) == ARGV[1] then
    redis.call('DEL', KEYS[i])
  end
end
local holder = redis.call('GET', KEYS[1])
if owner(holder) ~= ARGV[1] then
  return UNLOCK_NOT_HELD
end
redis.call('DEL', KEYS[1])
redis.call(ARGV[3], ARGV[2], 'free')
return UNLOCK_RELEASED
