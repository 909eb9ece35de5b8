--#include codec
-- entries.lua: which entry of a ready list stands for a ready job: the one
-- at the job's own place (places.lua).

-- at_place reports whether the encoded job v is ready in topic at place:
-- whether the entry at place stands for it.
local function at_place(v, topic, place)
  return v and byte(v, 1) % 8 == READY and read48(v, RESERVATION) == place and topic_of(v) == topic
end
