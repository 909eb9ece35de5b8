-- job.lua: the encoding of a job in the pool, shared by every script.
-- Prepended to each script at load time; defines no keys and reads no ARGV.
-- The layout of an encoded job is described once, in the table beside the
-- Go codec (pool.go, encodeJob). In Lua, header below is the one place that
-- writes the 22-byte header; encode and restate both call it.
-- at_ms is the reservation deadline of a reserved job (its score in its
-- bucket), and the time a ready or dead job became so. A delayed job's due
-- time is its score in its bucket; its at_ms is not read (push.lua leaves it
-- 0 for a job pushed with a delay, sparing a copy of the job).
-- reservation numbers the job's reservations: a consumer proves it still
-- holds the job by the number it was given. A ready job needs no number:
-- there the field holds its place in its ready list (see placed).

local DELAYED, READY, RESERVED, DEAD = 1, 2, 3, 4
local FORMAT = 128 -- the marker bit
local HAS_HEADERS = 64
local HAS_NONCE = 32
local HAS_WINDOW = 16
local HAS_ERROR = 8
local HEADER = 22

local floor, byte, char, sub = math.floor, string.byte, string.char, string.sub

local function u16(n)
  return char(floor(n / 256) % 256, n % 256)
end

local function u32(n)
  return char(floor(n / 16777216) % 256, floor(n / 65536) % 256, floor(n / 256) % 256, n % 256)
end

-- Positions (from 1, as Lua counts) of the 6-byte fields.
local AT, RESERVATION = 10, 16

-- read48 reads the 6-byte number at position from of an encoded job.
local function read48(v, from)
  local a1, a2, a3, a4, a5, a6 = byte(v, from, from + 5)
  return ((((a1 * 256 + a2) * 256 + a3) * 256 + a4) * 256 + a5) * 256 + a6
end

-- has reports whether flag is set in an encoded job's first byte.
local function has(v, flag)
  return math.floor(byte(v, 1) / flag) % 2 == 1
end

-- optional returns where each optional field of an encoded job starts
-- (error length, window, nonce, headers length; nil when absent) and where
-- the topic starts. It makes no table: decode runs for every job a script
-- touches.
-- (No multiple assignment whose targets are also read here: miniredis's
-- Lua orders those differently.)
local function optional(v)
  local flags = byte(v, 1)
  local pos, e, w, n, h = HEADER + 1, nil, nil, nil, nil
  if floor(flags / HAS_ERROR) % 2 == 1 then
    e = pos
    pos = pos + 2
  end
  if floor(flags / HAS_WINDOW) % 2 == 1 then
    w = pos
    pos = pos + 4
  end
  if floor(flags / HAS_NONCE) % 2 == 1 then
    n = pos
    pos = pos + 4
  end
  if floor(flags / HAS_HEADERS) % 2 == 1 then
    h = pos
    pos = pos + 2
  end
  return e, w, n, h, pos
end

-- topic_of reads an encoded job's topic.
local function topic_of(v)
  local _, _, _, _, from = optional(v)
  return sub(v, from, from + byte(v, HEADER) - 1)
end

-- bytes48 splits a whole number below 2^48 into its six bytes, high first,
-- with arithmetic alone: no string and no call to math.floor.
local function bytes48(n)
  local b6 = n % 256
  n = (n - b6) / 256
  local b5 = n % 256
  n = (n - b5) / 256
  local b4 = n % 256
  n = (n - b4) / 256
  local b3 = n % 256
  n = (n - b3) / 256
  local b2 = n % 256
  return (n - b2) / 256 % 256, b2, b3, b4, b5, b6
end

-- header writes a job's 22-byte header (see the table in pool.go): the one
-- place in Lua that lays it out. It makes one string with one string.char:
-- every string Lua makes is hashed and collected, and header runs for every
-- job a script stores, moves or reserves. attempts is capped at 65,535.
local function header(flags, attempts, max, ttr, at_ms, reservation, topic_len)
  attempts = math.min(attempts, 65535)
  local a2, m2, t4 = attempts % 256, max % 256, ttr % 256
  ttr = (ttr - t4) / 256
  local t3 = ttr % 256
  ttr = (ttr - t3) / 256
  local t2 = ttr % 256
  local x1, x2, x3, x4, x5, x6 = bytes48(at_ms)
  local l1, l2, l3, l4, l5, l6 = bytes48(reservation)
  return char(flags, (attempts - a2) / 256, a2, (max - m2) / 256, m2,
    (ttr - t2) / 256, t2, t3, t4, x1, x2, x3, x4, x5, x6, l1, l2, l3, l4, l5, l6, topic_len)
end

-- restate returns an encoded job in a new state with a new at_ms and,
-- when given, new attempts and reservation, the rest of it as it was: a
-- new header on a copy of the rest, not a decode and encode of its fields.
local function restate(v, state, at_ms, attempts, reservation)
  local flags, a1, a2, m1, m2, t1, t2, t3, t4 = byte(v, 1, 9)
  return header(flags - flags % 8 + state, attempts or a1 * 256 + a2, m1 * 256 + m2,
    ((t1 * 256 + t2) * 256 + t3) * 256 + t4, at_ms, reservation or read48(v, RESERVATION),
    byte(v, HEADER)) .. sub(v, HEADER + 1)
end

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

-- Counts. Each bucket keeps, in one hash (keys.go), how many of its jobs
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

-- A ready list loses entries only from its head, when a reserve call
-- trims what it took or dropped. Its bucket's counts hash also counts
-- them, under "0:<topic>", so that an entry's index plus that count is
-- its place in the list for good: a listing resumes there however many
-- entries left the head meanwhile, or came back to the tail (list.lua).
-- A ready job keeps the place of its entry (in the reservation field of its
-- header): an ID can be in a list more than once (a job that left the ready
-- state without leaving the list, and came back), and only the entry at the
-- job's own place stands for it; reserve and list calls drop or skip every
-- other. Once a list is empty, its count starts over (reserve.lua).

-- gone is how many entries were trimmed from the head of topic's ready
-- list: the place of its head.
local function gone(counts, topic)
  return tonumber(redis.call('HGET', counts, '0:' .. topic) or '0')
end

-- trimmed records n entries trimmed from the head of topic's ready list,
-- which holds left entries now; an empty list's count starts over.
local function trimmed(counts, topic, n, left)
  if left == 0 then
    redis.call('HDEL', counts, '0:' .. topic)
  elseif n > 0 then
    redis.call('HINCRBY', counts, '0:' .. topic, n)
  end
end

-- placed returns the place of the first of n entries just appended to
-- topic's ready list, which is len long now.
local function placed(counts, topic, n, len)
  return gone(counts, topic) + len - n
end

-- at_place reports whether the encoded job v is ready in topic at place:
-- whether the entry at place stands for it.
local function at_place(v, topic, place)
  return v and byte(v, 1) % 8 == READY and read48(v, RESERVATION) == place and topic_of(v) == topic
end

-- drop_zeros deletes the counts that are 0. It reads the counts alone: no
-- key it was not given, which a slot being migrated may have moved away.
local function drop_zeros(counts)
  local flat, zeros = redis.call('HGETALL', counts), {}
  for i = 2, #flat, 2 do
    if tonumber(flat[i]) == 0 then
      zeros[#zeros + 1] = flat[i - 1]
    end
  end
  if #zeros > 0 then
    in_chunks('HDEL', counts, zeros)
  end
end

-- tally_each adds sign times each topic's number in per_topic (topic ->
-- number) to the count of that topic's jobs in state.
local function tally_each(counts, state, per_topic, sign)
  for topic, n in pairs(per_topic) do
    tally(counts, state, topic, sign * n)
  end
end

-- add1 adds one to topic's number in per_topic.
local function add1(per_topic, topic)
  per_topic[topic] = (per_topic[topic] or 0) + 1
end

local function u32at(v, pos)
  local a, b, c, d = byte(v, pos, pos + 3)
  return ((a * 256 + b) * 256 + c) * 256 + d
end

-- decode reads an encoded job into a table; encode writes it back. The
-- headers are carried over as they are, never read.
local function decode(v)
  local flags, t1, t2, m1, m2, r1, r2, r3, r4 = byte(v, 1, 9)
  local tlen = byte(v, 22)
  local e, w, n, h, pos = optional(v)
  local elen, window, nonce, hlen = 0, 0, '', 0
  if e then
    local e1, e2 = byte(v, e, e + 1)
    elen = e1 * 256 + e2
  end
  if h then
    local h1, h2 = byte(v, h, h + 1)
    hlen = h1 * 256 + h2
  end
  if w then
    window = u32at(v, w)
  end
  if n then
    nonce = sub(v, n, n + 3)
  end
  return {
    state = flags % 8,
    attempts = t1 * 256 + t2,
    max = m1 * 256 + m2,
    ttr = ((r1 * 256 + r2) * 256 + r3) * 256 + r4,
    at = read48(v, AT),
    reservation = read48(v, RESERVATION),
    window = window,
    nonce = nonce,
    topic = sub(v, pos, pos + tlen - 1),
    err = sub(v, pos + tlen, pos + tlen + elen - 1),
    headers = sub(v, pos + tlen + elen, pos + tlen + elen + hlen - 1),
    body = sub(v, pos + tlen + elen + hlen),
  }
end

local function encode(j)
  local flags, err, elen, window, nonce, hlen = FORMAT + j.state, j.err, '', '', '', ''
  if err ~= '' then
    err = sub(err, 1, 65535)
    flags, elen = flags + HAS_ERROR, u16(#err)
  end
  if j.window > 0 then
    flags, window = flags + HAS_WINDOW, u32(j.window)
  end
  if j.nonce ~= '' then
    flags, nonce = flags + HAS_NONCE, j.nonce
  end
  if j.headers ~= '' then
    flags, hlen = flags + HAS_HEADERS, u16(#j.headers)
  end
  return header(flags, j.attempts, j.max, j.ttr, math.max(j.at, 0), j.reservation, #j.topic) ..
    elen .. window .. nonce .. hlen .. j.topic .. err .. j.headers .. j.body
end

-- window_of reads an encoded job's dedup window, 0 for none.
local function window_of(v)
  local _, w = optional(v)
  if not w then
    return 0
  end
  return u32at(v, w)
end

-- nonce_of reads an encoded job's push nonce, '' for none.
local function nonce_of(v)
  local _, _, n = optional(v)
  if not n then
    return ''
  end
  return sub(v, n, n + 3)
end

-- Dedup windows: a job pushed with one leaves a tombstone when it is
-- finished or removed, its ID scored by when the window ends, so that a
-- push of the same ID within the window creates nothing.

-- trim_buried deletes up to 1,000 tombstones whose window ended: the
-- lowest scores, by rank, so that one call stays short however many wait.
local function trim_buried(dedup, now_ms)
  local n = redis.call('ZCOUNT', dedup, '-inf', now_ms)
  if n > 0 then
    redis.call('ZREMRANGEBYRANK', dedup, 0, math.min(n, 1000) - 1)
  end
end

-- bury leaves the tombstone of a job, if it has a window, and deletes some
-- tombstones whose window ended.
local function bury(dedup, id, v, now_ms)
  local window = window_of(v)
  if window > 0 then
    redis.call('ZADD', dedup, now_ms + window, id)
    trim_buried(dedup, now_ms)
  end
end

-- buried reports whether a tombstone holds id.
local function buried(dedup, id, now_ms)
  local until_ms = redis.call('ZSCORE', dedup, id)
  return until_ms ~= false and tonumber(until_ms) > now_ms
end

-- now_us returns the Redis server's clock in microseconds.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- earliest returns the lowest score of a bucket, or nil when it is empty.
local function earliest(bucket)
  local head = redis.call('ZRANGE', bucket, 0, 0, 'WITHSCORES')
  if head[2] then
    return tonumber(head[2])
  end
  return nil
end

-- due_ms returns the due time of a job delayed by delay_ms from now (in
-- microseconds), rounded up so that it is never due before the full delay.
-- It adds milliseconds, not microseconds: Lua's numbers are doubles, exact
-- below 2^53, and the largest delay (9.2e12 ms) in microseconds is not.
local function due_ms(now, delay_ms)
  if delay_ms <= 0 then
    return math.floor(now / 1000)
  end
  return math.floor((now + 999) / 1000) + delay_ms
end

-- pushed_due returns the due time of a job a client pushed: after delay_ms
-- ("" when the encoded job v's at_ms holds its due time).
local function pushed_due(now, delay_ms, v)
  if delay_ms == '' then
    return read48(v, AT)
  end
  return due_ms(now, tonumber(delay_ms))
end

-- Wake-ups go out on the bucket's own channels with the publish command the
-- caller names (pub): SPUBLISH on Redis Cluster, where the channel lives in
-- the bucket's slot and reaches only that shard, PUBLISH elsewhere.

-- wake_if_first tells the bucket's handler, in microseconds from now, when
-- a job due at at_ms became the bucket's earliest.
local function wake_if_first(bucket, pub, wake, at_ms, now)
  if earliest(bucket) == at_ms then
    redis.call(pub, wake, string.format('%d', math.max(0, at_ms * 1000 - now)))
  end
end

-- Write order. A script may write to keys it was not given in KEYS (a
-- topic's ready list or dead letters, built from a prefix). While Redis
-- Cluster migrates the bucket's slot, such a write can fail with an error
-- that ends the script half-way, keeping what it wrote so far. So every
-- script writes to such a key first, before it changes the job: a failure
-- then leaves the job as it was, or at worst leaves an extra ID in a ready
-- list, which a consumer drops when the job is not ready.

-- schedule makes a job delayed until due_ms in its bucket, waking the
-- bucket's handler when it became the earliest.
local function schedule(pool, bucket, pub, wake, id, job, due, now)
  job.state, job.at = DELAYED, due
  redis.call('HSET', pool, id, encode(job))
  redis.call('ZADD', bucket, due, id)
  wake_if_first(bucket, pub, wake, due, now)
end

-- Ready signals. Beside each ready list, the bucket keeps a list of
-- signals of the same topic, one per job made ready and not yet claimed
-- (keys.go: dq:{name:b}:sig:<topic>). A waiting consumer blocks on it
-- (BLPOP): Redis hands each signal to exactly one of them, whichever
-- process it lives in, and that one reserves the job. A reserve call takes
-- no more jobs than the signals it holds or claims (reserve.lua), so a
-- job wakes one consumer, and one consumer's call does not empty a list
-- that others were woken for.

local ones = {} -- signals to push, grown as needed

-- signal_list adds n ready signals to the signal list key.
local function signal_list(key, n)
  for i = #ones + 1, n do
    ones[i] = '1'
  end
  redis.call('RPUSH', key, unpack(ones, 1, n))
end

-- signal adds n ready signals of topic.
local function signal(sig_prefix, topic, n)
  signal_list(sig_prefix .. topic, n)
end

-- make_ready puts a job in its topic's ready list, at the place it keeps,
-- and signals it.
local function make_ready(pool, ready_prefix, counts, sig_prefix, id, job, now)
  local len = redis.call('RPUSH', ready_prefix .. job.topic, id)
  job.state, job.at = READY, math.floor(now / 1000)
  job.reservation = placed(counts, job.topic, 1, len)
  redis.call('HSET', pool, id, encode(job))
  signal(sig_prefix, job.topic, 1)
end

-- kill moves a job to its topic's dead letters.
local function kill(pool, dead_prefix, dead_topics, id, job, now)
  job.state, job.at = DEAD, math.floor(now / 1000)
  redis.call('ZADD', dead_prefix .. job.topic, job.at, id)
  redis.call('SADD', dead_topics, job.topic)
  redis.call('HSET', pool, id, encode(job))
end

-- forget_records deletes the records of answered reserve calls that a
-- script of the settling kind (reserve, finish, retry, release, touch) is
-- given after its own keys, from KEYS[first] on (see reserve.lua).
local function forget_records(first)
  if #KEYS >= first then
    redis.call('DEL', unpack(KEYS, first))
  end
end

-- dead_gone takes topic off the bucket's dead-topics set once its dead
-- letters are all gone.
local function dead_gone(dead, dead_topics, topic)
  if redis.call('EXISTS', dead) == 0 then
    redis.call('SREM', dead_topics, topic)
  end
end

-- held returns the job with id when it is reserved under reservation; otherwise
-- nil and a status: 0 no such job, -1 the reservation is gone.
local function held(pool, id, reservation)
  local v = redis.call('HGET', pool, id)
  if not v then
    return nil, 0
  end
  local job = decode(v)
  if job.state ~= RESERVED or job.reservation ~= reservation then
    return nil, -1
  end
  return job
end
