#!lua flags=no-writes
--#include codec places entries
-- list.lua: one bounded step of a listing of a topic's jobs in one state,
-- in one bucket (inspect.go).
-- KEYS[1] what to walk: the bucket zset (delayed and reserved jobs of every
-- topic), or the topic's dead-letter zset or ready list  KEYS[2] pool hash
-- KEYS[3] the bucket's counts hash
-- ARGV[1] "z" to walk a zset, "l" a list  ARGV[2] topic  ARGV[3] state
-- ARGV[4] how many jobs to return at most  ARGV[5] how many entries to look at
-- at most  ARGV[6], ARGV[7] the entry after which the walk resumes ("", ""
-- from the start): in a zset its score and member; in a list its place
-- for good (see lib/places.lua) and ""
-- returns {done, pos, member, id, pos, job, id, pos, job, ...}: the jobs of
-- the topic in the state among the entries looked at, in order, each with
-- its position (score, or place in the list), after where the walk got to:
-- the last entry looked at, or the last job returned when ARGV[4] were
-- found ("" when none was looked at). done is 1 when the walk reached the end.
-- Read only. A zset resumes by score and member, so that entries leaving
-- or joining it between steps move nothing under the walk; a list resumes
-- after its place, which no entry leaving the head or joining the tail
-- changes.

local key, pool, kind, topic = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local state, limit, budget = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local after_pos, after = ARGV[6], ARGV[7]

-- not_after reports whether string a sorts at or before b byte by byte,
-- as Redis orders the members of one score (Lua's own comparison follows
-- the server's locale).
local function not_after(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = byte(a, i), byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a <= #b
end

-- zstart returns the rank of the first entry after (after_pos, after).
local function zstart()
  local s = redis.call('ZSCORE', key, after)
  if s and tonumber(s) == tonumber(after_pos) then
    return redis.call('ZRANK', key, after) + 1
  end
  -- Gone, or never here: search the entries of its score for where it
  -- would be.
  local lo = redis.call('ZCOUNT', key, '-inf', '(' .. after_pos)
  local hi = redis.call('ZCOUNT', key, '-inf', after_pos)
  while lo < hi do
    local mid = floor((lo + hi) / 2)
    if not_after(redis.call('ZRANGE', key, mid, mid)[1], after) then
      lo = mid + 1
    else
      hi = mid
    end
  end
  return lo
end

local first, ids, positions, total = 0, {}, {}, 0
if kind == 'z' then
  if after ~= '' then
    first = zstart()
  end
  local entries = redis.call('ZRANGE', key, first, first + budget - 1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    ids[#ids + 1] = entries[i]
    positions[#positions + 1] = string.format('%d', tonumber(entries[i + 1]))
  end
  total = redis.call('ZCARD', key)
else
  local head = gone(KEYS[3], topic)
  total = redis.call('LLEN', key)
  if after_pos ~= '' then
    first = math.max(0, tonumber(after_pos) + 1 - head)
    if first > total then
      first = 0 -- past the end: its count started over (lib/places.lua)
    end
  end
  ids = redis.call('LRANGE', key, first, first + budget - 1)
  for i = 1, #ids do
    positions[i] = head + first + i - 1
  end
end

local out = {0, '', ''}
if first + #ids >= total then
  out[1] = 1
end
if #ids == 0 then
  return out
end
local vs = redis.call('HMGET', pool, unpack(ids))
local found = 0
for i, id in ipairs(ids) do
  out[2], out[3] = positions[i], id
  local v = vs[i]
  local listed
  if kind == 'l' then
    listed = at_place(v, topic, positions[i]) -- its job's own entry (lib/entries.lua)
  else
    listed = v and byte(v, 1) % 8 == state and topic_of(v) == topic
  end
  if listed then
    out[#out + 1] = id
    out[#out + 1] = positions[i]
    out[#out + 1] = v
    found = found + 1
    if found == limit then
      if i < #ids then
        out[1] = 0
      end
      break
    end
  end
end
return out
