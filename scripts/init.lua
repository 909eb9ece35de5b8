#!lua flags=allow-oom
-- init.lua: open a queue: record its bucket count, job encoding and
-- identity on first use, and hand out an instance number for job IDs; or
-- look at it only; or put its record back after Redis lost it.
-- KEYS[1] queue meta hash
-- ARGV[1] bucket count the caller expects  ARGV[2] format it writes (queueFormat)
-- ARGV[3] 1 when the caller takes the stored bucket count, whatever it is
-- (ARGV[1] is then the count for a new queue), else 0
-- ARGV[4] mode: "open"; "look" (write nothing, take no number); "restore"
-- (a started process that knows the queue puts its record back when it is
-- gone, with the instance counter no lower than its own number)
-- ARGV[5] identity for a new queue (restore: the queue's)  ARGV[6] restore:
-- the caller's instance number
-- returns {stored bucket count, instance number, stored format, identity,
-- restored}: the stored values are the caller's when the queue is new or
-- restored; 0 buckets and "" identity when it does not exist (look). When
-- the bucket count or format disagrees with the caller's, no number is
-- handed out (0): New refuses. restored is 1 when restore wrote the record.
-- Allowed at maxmemory: the record is a few bytes, and a worker that cannot
-- open its queue cannot consume what fills Redis.

local meta, mode = KEYS[1], ARGV[4]
local restored = 0
if mode == 'open' and redis.call('HSETNX', meta, 'buckets', ARGV[1]) == 1 then
  redis.call('HSET', meta, 'format', ARGV[2], 'id', ARGV[5])
elseif mode == 'restore' and redis.call('HEXISTS', meta, 'buckets') == 0 then
  redis.call('HSET', meta, 'buckets', ARGV[1], 'format', ARGV[2], 'id', ARGV[5])
  if tonumber(redis.call('HGET', meta, 'nodes') or '0') < tonumber(ARGV[6]) then
    redis.call('HSET', meta, 'nodes', ARGV[6])
  end
  restored = 1
end
local buckets = tonumber(redis.call('HGET', meta, 'buckets') or '0')
local format = tonumber(redis.call('HGET', meta, 'format') or '0')
local id = redis.call('HGET', meta, 'id') or ''
local instance = 0
if mode == 'open' and (buckets == tonumber(ARGV[1]) or ARGV[3] == '1') and format == tonumber(ARGV[2]) then
  instance = redis.call('HINCRBY', meta, 'nodes', 1)
end
return {buckets, instance, format, id, restored}
