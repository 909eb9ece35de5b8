-- init.lua: record a queue's bucket count and job encoding on first use, and
-- hand out an instance number for job IDs.
-- KEYS[1] queue meta hash
-- ARGV[1] bucket count the caller expects  ARGV[2] format it writes (queueFormat)
-- ARGV[3] 1 when the caller takes the stored bucket count, whatever it is
-- (ARGV[1] is then the count for a new queue), else 0
-- returns {stored bucket count, instance number, stored encoding}: the
-- stored values are the caller's when the queue is new. A queue created
-- before the encoding was recorded has encoding 0. When either disagrees
-- with the caller's, no number is handed out (0): New refuses, and writes
-- nothing.

-- ARGV[4] 1 to look only (WithoutInstance): create nothing, take no
-- number, write nothing; a queue that does not exist has 0 buckets

local look = ARGV[4] == '1'
if not look and redis.call('HSETNX', KEYS[1], 'buckets', ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], 'format', ARGV[2])
end
local buckets = tonumber(redis.call('HGET', KEYS[1], 'buckets') or '0')
local format = tonumber(redis.call('HGET', KEYS[1], 'format') or '0')
local instance = 0
if not look and (buckets == tonumber(ARGV[1]) or ARGV[3] == '1') and format == tonumber(ARGV[2]) then
  instance = redis.call('HINCRBY', KEYS[1], 'nodes', 1)
end
return {buckets, instance, format}
