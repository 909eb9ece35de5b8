#!lua flags=no-writes
--#include codec places entries
-- summary.lua: the figures of one bucket, for Overview and Counts, a
-- bounded step at a time.
-- KEYS[1] counts hash  KEYS[2] pool hash  KEYS[3] dead topics set
-- KEYS[4] ready-list key prefix  KEYS[5] dead-letter key prefix
-- ARGV[1] one topic, or "" for every topic of the bucket, a step at a time:
-- ARGV[2] the cursor of the walk of the counts hash ("0" to start, "" once
-- done)  ARGV[3] the cursor of the walk of the dead topics set (walked once
-- the counts are done)  ARGV[4] about how many entries one step looks at
-- returns {now_ms, jobs in the pool, {field, count, ...}, {topic, dead jobs, ...},
-- {topic, at_ms of its oldest ready job, ...}, counts cursor, dead cursor}:
-- the counts fields are "<state>:<topic>" (see lib/counts.lua); a topic's oldest
-- ready job is the first of its ready list that stands for a ready job,
-- whose at_ms is when it became due; the cursors are those of the next
-- step, "" when its walk is done (a single topic takes one step).
-- Read only, and bounded: a step looks at about ARGV[4] counts or dead
-- topics, and each ready topic at no more than 1,000 entries of its ready
-- list for a job still ready.

local counts, pool, dead_topics, ready_prefix, dead_prefix = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local only, counts_at, dead_at, step = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])

-- oldest returns the at_ms of the first job of topic's ready list that is
-- still ready, or nil when none is among the first 1,000 entries: those
-- of jobs removed or rescheduled wait at the head until a consumer drops
-- them. It looks at 10 entries first, then more.
local function oldest(topic)
  local ready, head = ready_prefix .. topic, gone(counts, topic)
  local from = 0
  for _, n in ipairs({10, 90, 900}) do
    local ids = redis.call('LRANGE', ready, from, from + n - 1)
    if #ids == 0 then
      return nil
    end
    local vs = redis.call('HMGET', pool, unpack(ids))
    for i = 1, #ids do
      if at_place(vs[i], topic, head + from + i - 1) then
        return read48(vs[i], AT)
      end
    end
    from = from + n
  end
  return nil
end

local flat, dead, ages, readied = {}, {}, {}, {}
if only == '' and counts_at ~= '' then
  local scan = redis.call('HSCAN', counts, counts_at, 'COUNT', step)
  flat, counts_at = scan[2], scan[1]
  if counts_at == '0' then
    counts_at = ''
  end
  for i = 1, #flat, 2 do
    if string.sub(flat[i], 1, 2) == READY .. ':' and tonumber(flat[i + 1]) > 0 then
      readied[#readied + 1] = string.sub(flat[i], 3)
    end
  end
elseif only == '' then
  local scan = redis.call('SSCAN', dead_topics, dead_at, 'COUNT', step)
  dead_at = scan[1]
  if dead_at == '0' then
    dead_at = ''
  end
  for _, topic in ipairs(scan[2]) do
    dead[#dead + 1] = topic
    dead[#dead + 1] = redis.call('ZCARD', dead_prefix .. topic)
  end
else
  local fields = {DELAYED .. ':' .. only, READY .. ':' .. only, RESERVED .. ':' .. only}
  local vs = redis.call('HMGET', counts, unpack(fields))
  for i, f in ipairs(fields) do
    if vs[i] then
      flat[#flat + 1] = f
      flat[#flat + 1] = vs[i]
    end
  end
  if vs[2] and tonumber(vs[2]) > 0 then
    readied[1] = only
  end
  dead = {only, redis.call('ZCARD', dead_prefix .. only)}
  counts_at, dead_at = '', ''
end
for _, topic in ipairs(readied) do
  local at = oldest(topic)
  if at then
    ages[#ages + 1] = topic
    ages[#ages + 1] = at
  end
end
local t = redis.call('TIME')
return {tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000), redis.call('HLEN', pool), flat, dead, ages, counts_at, dead_at}
