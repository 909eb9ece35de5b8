#!lua flags=allow-oom
-- unlock.lua: release a bucket's lease if the caller still holds it, and tell
-- the other processes' handlers that the bucket is free.
-- KEYS[1] lease lock
-- ARGV[1] lease token  ARGV[2] wake channel  ARGV[3] publish command
-- returns 1 released, 0 the lease was not held by this token

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call(ARGV[3], ARGV[2], 'free')
return 1
