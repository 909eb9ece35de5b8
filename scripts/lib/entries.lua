--#include codec
-- entries.lua: which entry of a ready list stands for a ready job: the one
-- at the job's own place (places.lua).

-- at_place reports whether the encoded job v is ready in topic at place:
-- whether the entry at place stands for it.
local function at_place(v, topic, place)
  return v and byte(v, 1) % 8 == READY and read48(v, RESERVATION) == place and topic_of(v) == topic
end

-- STRANDED_MS is how long a ready job may wait with no signal left (one
-- was lost with a process that took it) before a call that holds none
-- takes it, or the holder gives it one (reserve.lua, move.lua).
local STRANDED_MS = 1000

-- stranded_at reports whether v, the job of topic's entry at place, is
-- ready there and has waited longer than STRANDED_MS by now_ms.
local function stranded_at(v, topic, place, now_ms)
  return at_place(v, topic, place) and now_ms - read48(v, AT) > STRANDED_MS
end

-- first_ready finds the first entry of topic's ready list that stands for
-- a ready job, looking past up to skips stale entries (the traces of jobs
-- that left the ready state) at its head, whose place is head. It returns
-- how many entries lie before it, and the job; or, when it found none,
-- how many stale entries to drop (skips at most) and whether the list
-- holds more.
local function first_ready(list, pool, topic, head, skips)
  local id = redis.call('LRANGE', list, 0, 0)[1]
  if not id then
    return 0, nil, false
  end
  local v = redis.call('HGET', pool, id)
  if at_place(v, topic, head) then
    return 0, v
  end
  local ids = redis.call('LRANGE', list, 1, skips)
  if #ids == 0 then
    return 1, nil, false
  end
  local vs = redis.call('HMGET', pool, unpack(ids))
  for i = 1, #ids do
    if at_place(vs[i], topic, head + i) then
      return i, vs[i]
    end
  end
  -- 1 + #ids entries, all stale: when that is more than skips, the
  -- last of them stays for the next look.
  return math.min(1 + #ids, skips), nil, #ids == skips
end
