#!lua flags=allow-oom
--#include lease
-- unlock.lua: give up a bucket's leases that the caller holds: the lease
-- (and then tell the standby, which takes the bucket over at once) and the
-- standby lease.
-- KEYS[1] lease lock  KEYS[2] standby lease
-- ARGV[1] lease token  ARGV[2] wake channel  ARGV[3] publish command
-- returns 1 when the lease was released, 0 when this token did not hold it

-- The answer, as lock.go reads it.
local UNLOCK_RELEASED = 1
local UNLOCK_NOT_HELD = 0

if owner(redis.call('GET', KEYS[2])) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
local holder = redis.call('GET', KEYS[1])
if owner(holder) ~= ARGV[1] then
  return UNLOCK_NOT_HELD
end
redis.call('DEL', KEYS[1])
redis.call(ARGV[3], ARGV[2], 'free')
return UNLOCK_RELEASED
