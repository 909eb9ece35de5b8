-- init.lua: record a queue's bucket count on first use and hand out a node
-- number for job IDs.
-- KEYS[1] queue meta hash
-- ARGV[1] bucket count the caller expects
-- returns {stored bucket count, node sequence}: the stored count is the
-- caller's when the queue is new.

redis.call('HSETNX', KEYS[1], 'buckets', ARGV[1])
return {tonumber(redis.call('HGET', KEYS[1], 'buckets')), redis.call('HINCRBY', KEYS[1], 'nodes', 1)}
