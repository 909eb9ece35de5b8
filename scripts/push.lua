#!lua
--#include codec header bulk tallies places due window clock wake signals
-- push.lua: add jobs to one bucket; a job whose ID exists already is left alone.
-- KEYS[1] pool hash  KEYS[2] bucket zset  KEYS[3] ready-list key prefix of the bucket
-- KEYS[4] dedup zset (tombstones of finished and removed jobs)  KEYS[5] counts hash
-- KEYS[6] ready-signal key prefix of the bucket
-- ARGV[1] wake channel  ARGV[2] publish command
-- ARGV[3..] four values per job:
--   id, delay_ms ("" when the job's at_ms holds its due time), the job
--   encoded as a delayed job (lib/codec.lua), with no attempts, reservation or error,
--   and at_ms 0 when a delay is given, and 1 when the queue generated the
--   id (0 for a caller's id); a job of a generated id carries a push nonce
-- returns one integer per job: 1 created, 0 a caller's id existed already
-- (as a job, or as a tombstone within its dedup window), -1 a generated id
-- is held by another job (nothing changed: the caller pushes again under a
-- new id)
-- Running it twice creates nothing new: the second run finds every id, and
-- a generated id held by a job of the same push nonce (this very push, run
-- before) counts as created.

local pool, bucket, ready_prefix, dedup, counts = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local sig_prefix, wake, pub = KEYS[6], ARGV[1], ARGV[2]

local now = now_us()
local now_ms = floor(now / 1000)
local created, topics = {}, {}

-- A job's answer, as push.go reads it.
local PUSH_CREATED = 1 -- stored under its ID
local PUSH_EXISTED = 0 -- a caller's ID that exists already
local PUSH_TAKEN = -1 -- a generated ID held by another job

-- nonce_of reads an encoded job's push nonce, '' for none.
local function nonce_of(v)
  local _, _, n = optional(v)
  if not n then
    return ''
  end
  return sub(v, n, n + 3)
end

-- buried reports whether a tombstone (lib/tombstones.lua) holds id.
local function buried(dedup, id, now_ms)
  local until_ms = redis.call('ZSCORE', dedup, id)
  return until_ms ~= false and tonumber(until_ms) > now_ms
end

-- taken reports whether a tombstone holds id. A generated id can have
-- one only when its job had a window of its own (the queue's default is
-- for callers' ids), and then this push carries it too.
local function taken(id, v, gen)
  return (gen ~= '1' or has_window(v)) and buried(dedup, id, now_ms)
end

-- existing answers for a job whose id is held by the job held (encoded):
-- a caller's id dedupes; a generated one is this job pushed before, or
-- another job's.
local function existing(held, v, gen)
  if gen ~= '1' then
    return PUSH_EXISTED
  end
  local nonce = nonce_of(held)
  if nonce ~= '' and nonce == nonce_of(v) then
    return PUSH_CREATED
  end
  return PUSH_TAKEN
end

-- One HMGET finds the ids taken already, and a few variadic writes store
-- the new jobs, whatever their number. Jobs due already go to their
-- topic's ready list first: the list may be a key this script was not
-- given, whose write can fail (see lib/ready.lua); the jobs themselves are
-- written afterwards, to the script's own keys.
local count = (#ARGV - 2) / 4
if count == 0 then
  return created
end
local ids = {}
for n = 1, count do
  ids[n] = ARGV[4 * n - 1]
end
local held = redis.call('HMGET', pool, unpack(ids))
local stored = {} -- id -> the job this call stored under it
local fields, scores, lists, first_due, delayed = {}, {}, {}, nil, {}
local readied = {} -- topic -> the jobs (encoded as pushed) of its list's ids
for n = 1, count do
  local id, delay, v, gen = ARGV[4 * n - 1], ARGV[4 * n], ARGV[4 * n + 1], ARGV[4 * n + 2]
  local due = pushed_due(now, delay, v)
  local cur = stored[id] or held[n]
  if cur then
    created[n] = existing(cur, v, gen)
  elseif taken(id, v, gen) then
    created[n] = PUSH_EXISTED
  else
    created[n] = PUSH_CREATED
    if due <= now_ms then
      local topic = topic_of(v)
      group(lists, topics, topic, id)
      group(readied, nil, topic, v)
    else
      -- Stored as the client encoded it: a delayed job's due time is its
      -- score, and its at_ms is not read (see lib/codec.lua).
      scores[#scores + 1] = due
      scores[#scores + 1] = id
      add1(delayed, topic_of(v))
      if first_due == nil or due < first_due then
        first_due = due
      end
      fields[#fields + 1] = id
      fields[#fields + 1] = v
    end
    stored[id] = v
  end
end
-- Each ready job is stored with its entry's place (lib/places.lua), known once
-- its list took the ids.
for _, topic in ipairs(topics) do
  local ids = lists[topic]
  local place = placed(counts, topic, #ids, redis.call('RPUSH', ready_prefix .. topic, unpack(ids)))
  for i, v in ipairs(readied[topic]) do
    fields[#fields + 1] = ids[i]
    fields[#fields + 1] = restate(v, READY, now_ms, nil, place + i - 1)
  end
end
if #fields > 0 then
  in_chunks('HSET', pool, fields)
end
if #scores > 0 then
  -- At most 2,000 values (maxPushChunk jobs): within what Lua unpacks.
  redis.call('ZADD', bucket, unpack(scores))
end

tally_each(counts, DELAYED, delayed, 1)
-- One signal per job that became ready: each wakes one consumer.
for _, topic in ipairs(topics) do
  tally(counts, READY, topic, #lists[topic])
  signal(sig_prefix, topic, #lists[topic])
end
-- Wake the bucket's handler when a new job became the earliest of the bucket.
if first_due ~= nil then
  wake_if_first(bucket, pub, wake, first_due, now)
end
return created
