-- counts.lua: each bucket keeps, in one hash (keys.go), how many of its jobs
-- of each topic are delayed, ready and reserved, under "<state>:<topic>",
-- so that a topic's counts cost one read however many jobs it has. Every
-- script that takes a job into one of these states or out of it tallies
-- the change, in the same call. A count that falls to 0 stays, so that a
-- topic whose jobs come and go costs no HDEL and HINCRBY each time; the
-- bucket handler deletes the zeros once a second (move.lua). Dead letters
-- are counted by their own sets.

-- tally adds n to the count of topic's jobs in state.
local function tally(counts, state, topic, n)
  if n ~= 0 then
    redis.call('HINCRBY', counts, state .. ':' .. topic, n)
  end
end
