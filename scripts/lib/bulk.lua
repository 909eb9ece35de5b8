-- bulk.lua: writes of many values at once.

-- in_chunks runs a variadic command over values, a slice at a time: Lua
-- unpacks at most 8,000 values. It returns the last call's reply.
local function in_chunks(cmd, key, values)
  local reply
  for from = 1, #values, 4000 do
    reply = redis.call(cmd, key, unpack(values, from, math.min(from + 3999, #values)))
  end
  return reply
end

-- group adds id to the list of topic in lists, and topic to topics (in
-- order of first appearance; when given) when it is new.
local function group(lists, topics, topic, id)
  local list = lists[topic]
  if not list then
    list = {}
    lists[topic] = list
    if topics then
      topics[#topics + 1] = topic
    end
  end
  list[#list + 1] = id
end
