#!lua flags=allow-oom
--#include codec header decode bulk tallies places tombstones clock bucket signals kill entries lease
-- move.lua: move due job IDs of one bucket to their topics' ready lists.
-- Holds the bucket's lease while it works: the caller's token takes a free
-- lease or extends its own. A lease held by another token moves nothing,
-- but for the standby (lock.go): the caller keeps or takes the standby
-- lease, and takes the bucket over when a job is overdue by the grace and
-- the holder has not moved for as long (a dead or frozen holder); or, the
-- standby lease held too, the second standby lease, and stands by in place
-- of a standby that is late (dead or frozen, perhaps with the holder).
-- KEYS[1] bucket zset  KEYS[2] pool hash  KEYS[3] ready-list key prefix
-- KEYS[4] dead-letter key prefix  KEYS[5] lease lock  KEYS[6] dead topics set
-- KEYS[7] dedup zset  KEYS[8] counts hash  KEYS[9] ready-signal key prefix
-- KEYS[10] standby lease  KEYS[11] watched string (schedule_tick.go)
-- KEYS[12] second standby lease
-- ARGV[1] lease token  ARGV[2] lease ms  ARGV[3] batch size  ARGV[4] 1 for
-- the holder's chores, else 0: delete (up to 1,000) tombstones whose dedup
-- window ended and the counts that are 0, and free the lease of a standby
-- (or second standby) that did not look when it said it would  ARGV[5] grace ms  ARGV[6..] topics whose jobs the
-- holder made ready over a second ago, to look for a lost signal (below);
-- "" for every topic with ready jobs in the bucket
-- returns {moved, next_due_in_us or -1, flags, topic, count, topic, count,
-- ...} with how many jobs became ready per topic, flags adding FRESH when
-- the call took a free lease or the bucket over (not when it extended its
-- own) and VACATED when it freed a standby lease (the caller tells the
-- others), and count 0 for a topic of ARGV[6..] whose waiting job got a
-- signal;
-- {-2, takeover_in_us or -1, lease ttl ms, flags, topic, 0, ...} when the
-- caller is the standby, takeover_in_us being how long until the bucket's
-- next job is overdue by the grace and the holder silent as long (-1: no
-- job), flags VACATED when it left the second standby lease for the
-- standby's and SOONER when the second standby would look only well after
-- the standby's next look (the caller tells it), with the topics of its
-- look (below) whose waiting job got a signal; {-3, look_in_us, 0} when the caller is the second standby, to
-- look again then: when the standby would be late (or, late already, when
-- the bucket would be in need), and at least every third of the lease;
-- {-1, ttl ms} when other tokens hold all three
-- leases, ttl the second standby's.
-- A due delayed job becomes ready; an expired reservation becomes ready again,
-- or dead when its attempts ran out. Running it twice moves nothing twice:
-- every moved ID leaves the bucket in the same call. An ID whose job is no
-- longer delayed or reserved (a call that failed half-way moved it) just
-- leaves the bucket.

local bucket, pool, ready_prefix, dead_prefix, lock, dead_topics = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local sig_prefix, standby, second = KEYS[9], KEYS[10], KEYS[12]
local token, lease, batch, trim, grace = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])

-- The first value of the reply of a caller that does not hold the lease
-- (a holder's is how many jobs it moved), as bucket.go reads it.
local MOVE_NEITHER = -1 -- other tokens hold the three leases
local MOVE_STANDBY = -2 -- the caller stands by
local MOVE_SECOND = -3 -- the caller is the second standby
-- The flags of a holder's reply (and a standby's).
local MOVE_FRESH = 1 -- the call took a free lease or the bucket over
local MOVE_VACATED = 2 -- the call freed a standby lease
local MOVE_SOONER = 4 -- the second standby is to look sooner (a standby's reply)
-- How much sooner than the second standby planned for the standby must
-- come to look, for the second standby to be told (handler.go's replanBy).
local MOVE_REPLAN_MS = 1000

local now = now_us()
local now_ms = math.floor(now / 1000)

-- drop_zeros deletes the counts that are 0 (lib/counts.lua). It reads the
-- counts alone: no key it was not given, which a slot being migrated may
-- have moved away.
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

-- until_due is the reply's time until the bucket's next job is due.
local function until_due()
  local next_due = earliest(bucket)
  if next_due == nil then
    return -1
  end
  return math.max(0, next_due * 1000 - now)
end

-- A signal handed to a process that no longer reads its replies (frozen,
-- or cut off without its connection closing) is lost with it, and the
-- consumers that wait elsewhere do not wake for its job. So, a second
-- after it made jobs of a topic ready, the holder looks at the topic's
-- list: the first job in it (past up to 7 traces of jobs that left it),
-- ready for over a second while no signal is left, gets one, and the
-- reply says so: the holder looks again a second later, should that
-- signal be lost too. Its consumer's call signals the job behind it, if
-- that one waited too (reserve.lua). A list whose first 8 entries are
-- traces while the counts say it holds ready jobs gets a signal all the
-- same: the call it wakes drops the traces. Once per safety poll ("" in
-- ARGV[6..]) the holder and the standby look so at every topic with
-- ready jobs in the bucket: a job pushed ready, which no holder made
-- ready, may have lost its signal too, maybe to the holder itself.
local looked = {}
local function look_stranded(out, topic, ready_n)
  if looked[topic] then
    return
  end
  looked[topic] = true
  local sig = sig_prefix .. topic
  if redis.call('LLEN', sig) > 0 then
    return
  end
  local head = gone(KEYS[8], topic)
  local before, v, more = first_ready(ready_prefix .. topic, pool, topic, head, 7)
  local stuck
  if v then
    stuck = stranded_at(v, topic, head + before, now_ms)
  else
    stuck = more and (ready_n or tonumber(redis.call('HGET', KEYS[8], READY .. ':' .. topic) or '0')) > 0
  end
  if stuck then
    signal_list(sig, 1)
    out[#out + 1] = topic
    out[#out + 1] = 0
  end
end

-- look_asked looks at the topics of ARGV[6..] ("": every topic with
-- ready jobs), adding a topic and 0 to out for each signal it gave.
local function look_asked(out)
  for i = 6, #ARGV do
    if ARGV[i] == '' then
      local flat, prefix = redis.call('HGETALL', KEYS[8]), READY .. ':'
      for j = 1, #flat, 2 do
        local n = tonumber(flat[j + 1])
        if sub(flat[j], 1, #prefix) == prefix and n > 0 then
          look_stranded(out, sub(flat[j], #prefix + 1), n)
        end
      end
    else
      look_stranded(out, ARGV[i])
    end
  end
end

-- Every caller, whatever its lease role, vouches that a started process
-- watches the bucket until twice its lease from now: it looks again before
-- then. A look after the latest vouched time starts a new watch (schedule_tick.go:
-- the ticks before it came in an outage).
local seen = redis.call('GET', KEYS[11])
local since, till = now_ms, now_ms + 2 * lease
local seen_since, seen_till = string.match(seen or '', '^(%d+) (%d+)$')
if seen_till and tonumber(seen_till) >= now_ms then
  since, till = tonumber(seen_since), math.max(till, tonumber(seen_till))
end
redis.call('SET', KEYS[11], string.format('%d %d', since, till), 'PX', till - now_ms)

-- A standby (or second standby) that has not looked STANDBY_LATE_MS after
-- it said it would (or, saying nothing, in half its lease; it renews at
-- least every third) died or froze. One whose lease is not known is left
-- to run out. The second standby acts on a late standby sooner when the
-- holder is silent too: it may have died with the standby, and then
-- nobody else looks.
local STANDBY_LATE_MS = 1000
local SECOND_LATE_MS = 100

-- late reports whether the standby lease at key, whose value is v, is
-- late by more than by ms.
local function late(key, v, by)
  local ms, look_at = lease_of(v)
  if look_at then
    return now_ms > look_at + by
  end
  return ms ~= nil and ms - redis.call('PTTL', key) > ms / 2
end

-- drop frees the lease at key when token holds it, and reports whether it did.
local function drop(key)
  if owner(redis.call('GET', key)) == token then
    redis.call('DEL', key)
    return true
  end
  return false
end

local holder = redis.call('GET', lock)
local flags = 0
if holder == false then
  redis.call('SET', lock, token .. ' ' .. lease, 'PX', lease)
  -- A standby that takes a lease let go leaves its standby lease to
  -- another, as one that takes the bucket over does.
  if drop(standby) or drop(second) then
    flags = MOVE_VACATED
  end
  flags = flags + MOVE_FRESH
elseif owner(holder) == token then
  redis.call('PEXPIRE', lock, lease)
  -- A dead standby's lease goes, and another process stands by in its
  -- place, so that the bucket does not wait out that lease should its
  -- holder die next.
  if trim == '1' then
    for _, key in ipairs({standby, second}) do
      local v = redis.call('GET', key)
      if v and late(key, v, STANDBY_LATE_MS) then
        redis.call('DEL', key)
        flags = MOVE_VACATED
      end
    end
  end
else
  local waiting = redis.call('GET', standby)
  local mine = owner(waiting) == token -- the caller stands by
  local other = waiting and not mine -- another does
  local behind = not mine and redis.call('GET', second) -- read once, for both uses below
  if other then
    if behind and owner(behind) ~= token then
      -- The others come when the second standby's lease would run out: a
      -- late standby's place goes to the second standby, which says so.
      return {MOVE_NEITHER, redis.call('PTTL', second)}
    end
  end
  local ttl = redis.call('PTTL', lock)
  local first = earliest(bucket)
  local silent = (lease_of(holder) or lease) - ttl
  if other then
    -- The second standby stands in for a standby a tenth of a second
    -- late when the bucket needs it now (a job overdue by the grace, the
    -- holder silent as long: both may have died together; a standby that
    -- is only slow then loses nothing it would have done), and a second
    -- late otherwise, as the holder would: a slow standby is not pushed
    -- out while the holder moves.
    local urgent = first ~= nil and first <= now_ms - grace and silent >= grace
    if not late(standby, waiting, urgent and SECOND_LATE_MS or STANDBY_LATE_MS) then
      -- It looks again when the standby would be late, and at least
      -- every third of its lease. A standby late already, while the
      -- bucket is not in need: when it would be (the holder silent for
      -- the grace, with a job overdue as long), or when the standby is a
      -- second late, whichever comes first. Waiting for the second alone,
      -- a holder that died just before the look would cost its jobs that
      -- second.
      local _, look_at = lease_of(waiting)
      local wait_ms = math.floor(lease / 3)
      if look_at then
        local at = look_at + SECOND_LATE_MS + 1
        if at <= now_ms then
          at = look_at + STANDBY_LATE_MS + 1
          if first ~= nil then
            at = math.min(at, math.max(first + grace, now_ms + grace - silent))
          end
        end
        wait_ms = math.min(wait_ms, at - now_ms)
      end
      redis.call('SET', second, token .. ' ' .. lease .. ' ' .. (now_ms + wait_ms), 'PX', lease)
      return {MOVE_SECOND, wait_ms * 1000, 0}
    end
    -- The standby is late: it died or froze, perhaps with the holder.
    -- Stand by in its place, and look at the holder now.
    redis.call('DEL', standby)
  end
  -- One that comes to stand by leaves the second standby lease to another.
  if not mine and owner(behind) == token then
    redis.call('DEL', second)
    flags = MOVE_VACATED
  end
  -- The standby looks again when it could take the bucket over, and at
  -- least every third of its lease (handler.go).
  local out, wait_ms = nil, math.floor(lease / 3)
  if first == nil then
    out = {MOVE_STANDBY, -1, ttl, flags}
  elseif first > now_ms - grace or silent < grace then
    local until_ms = math.max(first + grace - now_ms, grace - silent, 0)
    out, wait_ms = {MOVE_STANDBY, until_ms * 1000, ttl, flags}, math.min(wait_ms, until_ms)
  end
  if out then
    local look = now_ms + wait_ms
    redis.call('SET', standby, token .. ' ' .. lease .. ' ' .. look, 'PX', lease)
    -- A second standby that planned its look for an older look of the
    -- standby's, over a second later (the standby woke for a job pushed
    -- since), is told to look sooner: should holder and standby die
    -- before its planned look, the bucket's jobs would wait for it.
    local _, second_at = lease_of(redis.call('GET', second) or '')
    if second_at and second_at > look + SECOND_LATE_MS + 1 + MOVE_REPLAN_MS then
      out[4] = out[4] + MOVE_SOONER
    end
    look_asked(out)
    return out
  end
  -- Overdue, and nothing moved: take the bucket over.
  redis.call('SET', lock, token .. ' ' .. lease, 'PX', lease)
  redis.call('DEL', standby)
  flags = MOVE_FRESH + MOVE_VACATED
end

if trim == '1' then
  trim_buried(KEYS[7], now_ms)
  drop_zeros(KEYS[8])
end
-- A job's score is when it was due (or its reservation ran out): a ready
-- job's at_ms keeps it, so that its delivery's lateness can be told.
local scored = redis.call('ZRANGEBYSCORE', bucket, '-inf', now_ms, 'WITHSCORES', 'LIMIT', 0, batch)
local ids, dues = {}, {}
for i = 1, #scored, 2 do
  ids[#ids + 1], dues[#dues + 1] = scored[i], floor(tonumber(scored[i + 1]))
end
local lists, topics, fields = {}, {}, {}
local readied = {} -- topic -> per id of its list: the job (decoded) or encoded job, and its due time
local left = {[DELAYED] = {}, [RESERVED] = {}} -- state -> topic -> jobs that left it

if #ids > 0 then
  local vs = redis.call('HMGET', pool, unpack(ids))
  for k, id in ipairs(ids) do
    local v = vs[k]
    local state = v and byte(v, 1) % 8
    if state == RESERVED or state == DELAYED then
      local job, topic
      if state == RESERVED then
        job = decode(v)
        job.err = 'reservation ran out (TTR ' .. string.format('%d', job.ttr) .. ' ms)'
      end
      if job and job.attempts >= job.max then
        add1(left[RESERVED], job.topic)
        kill(pool, dead_prefix, dead_topics, id, job, now)
      else
        topic = job and job.topic or topic_of(v)
        add1(left[state], topic)
        group(lists, topics, topic, id)
        group(readied, nil, topic, job or v)
        group(readied, nil, topic, dues[k])
      end
    end
  end
  -- The ready lists first: see lib/ready.lua. Each job is stored with its
  -- entry's place, known once its list took the ids.
  for _, topic in ipairs(topics) do
    local place = placed(KEYS[8], topic, #lists[topic], in_chunks('RPUSH', ready_prefix .. topic, lists[topic]))
    local r = readied[topic]
    for i = 1, #lists[topic] do
      local job, due, v = r[2 * i - 1], r[2 * i], nil
      if type(job) == 'table' then
        job.state, job.at, job.reservation = READY, due, place + i - 1
        v = encode(job)
      else
        v = restate(job, READY, due, nil, place + i - 1)
      end
      fields[#fields + 1] = lists[topic][i]
      fields[#fields + 1] = v
    end
  end
  if #fields > 0 then
    in_chunks('HSET', pool, fields)
  end
  -- The IDs are the bucket's lowest: removing them by rank costs one walk
  -- of the skiplist, not one per ID (ZREM), whatever the bucket holds.
  redis.call('ZREMRANGEBYRANK', bucket, 0, #ids - 1)
  tally_each(KEYS[8], DELAYED, left[DELAYED], -1)
  tally_each(KEYS[8], RESERVED, left[RESERVED], -1)
end
-- One signal per job that became ready: each wakes one consumer.
local out = {#ids, until_due(), flags}
for _, topic in ipairs(topics) do
  tally(KEYS[8], READY, topic, #lists[topic])
  signal(sig_prefix, topic, #lists[topic])
  out[#out + 1] = topic
  out[#out + 1] = #lists[topic]
end

look_asked(out)
return out
