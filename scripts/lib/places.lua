-- places.lua: a ready list loses entries only from its head, when a reserve
-- call trims what it took or dropped. Its bucket's counts hash also counts
-- them, under "0:<topic>", so that an entry's index plus that count is
-- its place in the list for good: a listing resumes there however many
-- entries left the head meanwhile, or came back to the tail (list.lua).
-- A ready job keeps the place of its entry (in the reservation field of its
-- header): an ID can be in a list more than once (a job that left the ready
-- state without leaving the list, and came back), and only the entry at the
-- job's own place stands for it (entries.lua); reserve and list calls drop
-- or skip every other. Once a list is empty, its count starts over
-- (reserve.lua).

-- gone is how many entries were trimmed from the head of topic's ready
-- list: the place of its head.
local function gone(counts, topic)
  return tonumber(redis.call('HGET', counts, '0:' .. topic) or '0')
end

-- placed returns the place of the first of n entries just appended to
-- topic's ready list, which is len long now.
local function placed(counts, topic, n, len)
  return gone(counts, topic) + len - n
end
