-- dead.lua: the set of a bucket's topics that have dead letters.

-- dead_gone takes topic off the bucket's dead-topics set once its dead
-- letters are all gone.
local function dead_gone(dead, dead_topics, topic)
  if redis.call('EXISTS', dead) == 0 then
    redis.call('SREM', dead_topics, topic)
  end
end
