--#include decode
-- kill.lua: making a job dead. Its dead letters are written first (see
-- ready.lua's write order).

-- kill moves a job to its topic's dead letters.
local function kill(pool, dead_prefix, dead_topics, id, job, now)
  job.state, job.at = DEAD, math.floor(now / 1000)
  redis.call('ZADD', dead_prefix .. job.topic, job.at, id)
  redis.call('SADD', dead_topics, job.topic)
  redis.call('HSET', pool, id, encode(job))
end
