--#include counts
-- tallies.lua: counts (counts.lua) of many jobs at once, gathered per topic.

-- add1 adds one to topic's number in per_topic.
local function add1(per_topic, topic)
  per_topic[topic] = (per_topic[topic] or 0) + 1
end

-- tally_each adds sign times each topic's number in per_topic (topic ->
-- number) to the count of that topic's jobs in state.
local function tally_each(counts, state, per_topic, sign)
  for topic, n in pairs(per_topic) do
    tally(counts, state, topic, sign * n)
  end
end
