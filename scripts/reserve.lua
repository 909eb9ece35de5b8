#!lua flags=allow-oom
--#include codec header entries clock wake signals finish grants
-- reserve.lua: pop ready jobs of a topic from one bucket and reserve them,
-- no more than the ready signals the caller holds or claims (lib/signals.lua).
-- KEYS[1] ready list  KEYS[2] pool hash  KEYS[3] bucket zset  KEYS[4] reservation counter
-- KEYS[5] the record of this call (a key of the caller's, which no other
-- call of the caller's uses while this one may still run)  KEYS[6] counts
-- hash  KEYS[7] the topic's ready signals  KEYS[8] paused topics of the bucket
-- KEYS[9] dedup zset  KEYS[10] the topic's lost-signal look of the bucket
-- KEYS[11] the prefix of the jobs' grants (lib/grants.lua)
-- ARGV[1] wake channel  ARGV[2] publish command  ARGV[3] how many stale IDs to skip
-- ARGV[4] the list's topic  ARGV[5] how many jobs to reserve at most
-- ARGV[6] how long the record lives, ms  ARGV[7] how many signals the
-- caller holds (taken off the signals by a blocked pop)  ARGV[8] "1" to
-- take as many jobs as asked whatever the signals (a consumer that will
-- not wait), claiming those it can; "2" for a call that comes only to
-- claim signals another call's reply said were left: when it holds none
-- and finds none, it reads only the list's length; "3" for a look for a
-- lost signal: when it holds none and finds none, it looks only if no
-- other call did in the last second (KEYS[10]), and otherwise reads only
-- the list's length  ARGV[9] the call's name, new for
-- every call and the same when it is sent again  ARGV[10] how many jobs
-- of the bucket the call finishes first, F  ARGV[11..10+3F] those jobs, as
-- finish.lua takes them: triples of a job ID, a reservation and whether
-- the caller holds its grant (a consumer's finishes ride on its next
-- reserve call: one script call where two would be, and a job whose grant
-- passes to the next, limits_handon.go); never one for any reservation,
-- whose grant the reply would not carry
-- ARGV[11+3F] how many of the signals left after the call's own to take
-- for other consumers of the caller's that wait (0 when absent): they
-- are given to those consumers, whose reserve calls hold them, rather
-- than left for their calls to claim, which other processes' blocked pops
-- race  ARGV[12+3F] how many grants follow, G (0 when absent)
-- ARGV[13+3F..12+3F+G] the grant each job the call reserves holds, in
-- order ("" for none), recorded beside it (lib/grants.lua)
-- returns {status, signals left, signals given, id, job, due_ms, ..., F answers}:
-- the jobs reserved, each with when it was due (its at_ms while ready; 0
-- when not known; a second run's job may be nil, see replay), the signals the list still holds (-1: none, and the
-- list still holds jobs, whose signals are on their way or were lost with
-- a consumer that died holding them, or may hold some behind the stale
-- IDs the call dropped; -2: none, and the call read the list to its end:
-- it holds no job), and status 1 when as
-- many as asked were reserved, 0 when the list or the signals ran out, 2
-- when the stale IDs dropped reached the limit and the list may hold more,
-- 3 when the topic is paused (the caller's signals are put back), 4 when
-- a call that came only to claim signals found none, or a look for a lost
-- signal found that another call looked in the last second (ARGV[8]; it
-- says -1 or -2 as a look would, from the list's length alone); and last
-- the finishes' answers, as finish.lua gives them. The signals given
-- (ARGV[11+3F]) are 0 unless the call reserved jobs; a second run of the
-- call answers as many as its first gave (the record says).
-- The call claims a signal for each job it reserves beyond those it holds.
-- A job that waited over a second while no signal was left (one was lost
-- with a consumer that died holding it) is taken all the same, and a signal
-- is added for the job behind it, so that waiting consumers wake for it. A
-- call with no signal looks for that job past the stale IDs at the head of
-- the list, up to the limit, and drops them.
-- An entry that does not stand for a ready job (lib/entries.lua: its job was
-- removed, is no longer ready, is now a job of another topic, or is ready
-- at another place of the list) is dropped: it is the trace of a job that
-- left the ready state without leaving the list.
-- Each reservation takes a new number from the bucket's counter as its
-- reservation, so no two reservations of one ID, even of a job removed and pushed
-- again, ever share a reservation.
-- The reservation lasts the job's TTR: the job waits in the bucket, scored by
-- its reservation deadline, and is moved back to ready if not finished by then.
-- Running it twice returns the same jobs: a call that reserves jobs records
-- what it reserved, under its name, in KEYS[5] before it changes anything,
-- and a second run of the call (go-redis re-sends it when the reply was
-- lost) answers from the record, so a reservation whose reply never
-- arrived does not spend an attempt of a job nobody received. The caller's
-- next call with the same key writes over the record (no command spent
-- deleting it); it expires in any case. A call that carries finishes
-- records their answers too, whatever it reserved: its second run finds
-- those jobs gone, and answers for them from the record.

local ready, pool, bucket, reservations, record = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local signals, paused = KEYS[7], KEYS[8]
local wake, pub, skips, topic = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local held = tonumber(ARGV[7])
local name = ARGV[9]
local finishes = tonumber(ARGV[10])
local finish_answers = finishes > 0 and finish_jobs(pool, bucket, KEYS[9], KEYS[6], KEYS[11], ARGV, 11, 10 + 3 * finishes)
local give = tonumber(ARGV[11 + 3 * finishes]) or 0
local grants_from, grants_n = 13 + 3 * finishes, tonumber(ARGV[12 + 3 * finishes]) or 0
local given = 0

-- answer is the reply out, with the signals given third, followed by the
-- finishes' answers.
local function answer(out)
  table.insert(out, 3, given)
  if finish_answers then
    for _, a in ipairs(finish_answers) do
      out[#out + 1] = a
    end
  end
  return out
end

-- The call's status, first in its reply (ready.go reads it).
local RESERVE_RAN_OUT = 0 -- the list, or the signals, ran out
local RESERVE_FILLED = 1 -- as many as asked were reserved
local RESERVE_STALE = 2 -- the stale IDs dropped reached the limit
local RESERVE_PAUSED = 3 -- the topic is paused
local RESERVE_UNCLAIMED = 4 -- a call that came only to claim signals found none
-- How the call takes jobs (ARGV[8]): as many as asked, whatever the
-- signals; or only the signals it comes to claim.
local RESERVE_GREEDY = 1
local RESERVE_CLAIM = 2
local RESERVE_LOST = 3
local mode = tonumber(ARGV[8])
-- In place of the signals left: none, and the list still holds jobs.
local RESERVE_NO_SIGNAL = -1
-- In place of the signals left: none, and the list holds no job.
local RESERVE_DRY = -2


-- Redis's Lua unpacks at most 8,000 values: the caller asks for at most
-- maxReserve (ready.go), and the script never takes more than 1,000.
local asked = math.min(tonumber(ARGV[5]), 1000)
local keep = tonumber(ARGV[6])

-- ours reports whether rec, a record read from KEYS[5], is this call's.
local function ours(rec)
  return rec and sub(rec, 1, #name + 1) == name .. '\n'
end

-- record_of is the record of this call: its name, the finishes' answers
-- ("-" for none), how it ended, the reservation before its first, the
-- signals it gave (ARGV[11+3F]), and the IDs it reserved.
local function record_of(status, reservation, found)
  local answers = finish_answers and table.concat(finish_answers, ',') or '-'
  return name .. '\n' .. answers .. '\n' .. status .. '\n' .. string.format('%d', reservation) .. '\n' ..
    given .. '\n' .. table.concat(found, '\n')
end

-- replay answers a second run from the record (record_of): the finishes'
-- answers, the signals the first run gave, and the jobs it reserved, in
-- their places; a job no longer reserved under its reservation (another
-- process settled it since) comes as its ID and nil. Its place keeps the
-- places of the jobs after it, whose grants the caller reads by place:
-- the grant of its own left with whoever settled it. The signals left
-- are those of now, or none (-1 or -2, as a look says).
local function replay(rec)
  local fields = {}
  for f in string.gmatch(rec, '[^\n]+') do
    fields[#fields + 1] = f
  end
  if finish_answers and fields[2] ~= '-' then
    local i = 0
    for a in string.gmatch(fields[2], '[^,]+') do
      i = i + 1
      finish_answers[i] = tonumber(a)
    end
  end
  local status, base = tonumber(fields[3]), tonumber(fields[4])
  given = tonumber(fields[5])
  local left = redis.call('LLEN', signals)
  if left == 0 and given == 0 then
    left = redis.call('LLEN', ready) > 0 and RESERVE_NO_SIGNAL or RESERVE_DRY
  end
  local out = {status, left}
  for i = 6, #fields do
    local id = fields[i]
    local v = redis.call('HGET', pool, id)
    out[#out + 1] = id
    if v and byte(v, 1) % 8 == RESERVED and read48(v, RESERVATION) == base + i - 5 then
      out[#out + 1] = v
    else
      out[#out + 1] = false -- settled elsewhere since: a hole, which keeps its place
    end
    out[#out + 1] = 0
  end
  return out
end

-- again reads the record for a call that reserves nothing, ending as
-- status: a second run of the call returns its first run's reply from it
-- (replay); a first records how it ended, if it carries finishes, and
-- returns nil.
local function again(status)
  local rec = redis.call('GET', record)
  if ours(rec) then
    return answer(replay(rec))
  end
  if finish_answers then
    redis.call('SET', record, record_of(status, 0, {}), 'PX', keep)
  end
end

if redis.call('SISMEMBER', paused, topic) == 1 then
  -- A second run answers from the record: its first may have reserved
  -- jobs before the topic was paused.
  local reply = again(RESERVE_PAUSED)
  if reply then
    return reply
  end
  if held > 0 then
    signal_list(signals, held)
  end
  return answer({RESERVE_PAUSED, redis.call('LLEN', signals)})
end

-- A call that came for signals another call's reply said were left, and
-- finds that other processes took them, reads nothing more of the list
-- than whether it holds entries: their signals were taken, or lost with a
-- process that died holding them, and the caller looks for a lost signal
-- as after a look that found none. It costs a few commands, not a look.
-- So does a look for a lost signal, holding none and finding none, when
-- another call looked in the last second: every process whose replies
-- said that jobs were left without a signal comes to look, and one a
-- second is enough (the job it takes has waited a second, as above).
--
-- looked_lately reports whether another call looked for a lost signal in
-- the last second and, when none did, marks this call's look. The key
-- holds until when a look stands, on the server's clock, besides
-- expiring then: on a server whose keys do not expire as time passes
-- (miniredis), the next look still comes a second later. It reads the
-- server's clock into now, which the rest of the call then uses.
local now -- the server's clock, µs: read once, by whichever part first needs it
local function looked_lately()
  now = now_us()
  local now_ms = floor(now / 1000)
  local until_ms = tonumber(redis.call('GET', KEYS[10]))
  if until_ms and until_ms > now_ms then
    return true
  end
  redis.call('SET', KEYS[10], string.format('%d', now_ms + STRANDED_MS), 'PX', STRANDED_MS)
  return false
end
local left = redis.call('LLEN', signals) -- the signals the list holds
if held == 0 and left == 0 and (mode == RESERVE_CLAIM or mode == RESERVE_LOST and looked_lately()) then
  local reply = again(RESERVE_UNCLAIMED)
  if reply then
    return reply
  end
  if redis.call('LLEN', ready) > 0 then
    return answer({RESERVE_UNCLAIMED, RESERVE_NO_SIGNAL})
  end
  return answer({RESERVE_UNCLAIMED, RESERVE_DRY})
end

now = now or now_us()
local now_ms = floor(now / 1000)
-- The topic's counts this call changes, read at once and written back at
-- once (lib/counts.lua, lib/places.lua): the place of the list's head,
-- and how many jobs are ready and reserved.
local counts = KEYS[6]
local count_fields = {'0:' .. topic, READY .. ':' .. topic, RESERVED .. ':' .. topic}
local cur = redis.call('HMGET', counts, unpack(count_fields))
local head = tonumber(cur[1] or '0')

-- trimmed records n entries trimmed from the head of the list, which
-- still holds entries when more is true, and n_ready jobs reserved: the
-- place of the head moves on, and an empty list's count starts over
-- (0 is dropped with the other zeros, move.lua).
local function trimmed(n, more, n_ready)
  local args = {}
  if n > 0 or not more then
    args[1], args[2] = count_fields[1], more and string.format('%d', head + n) or '0'
  end
  if n_ready > 0 then
    args[#args + 1], args[#args + 2] = count_fields[2], string.format('%d', tonumber(cur[2] or '0') - n_ready)
    args[#args + 1], args[#args + 2] = count_fields[3], string.format('%d', tonumber(cur[3] or '0') + n_ready)
  end
  if #args > 0 then
    redis.call('HSET', counts, unpack(args))
  end
end

-- OWED_MS is how long past its ready time a job may be taken before the
-- call deems that a signal was lost for it (below): far longer than a
-- signal takes from a blocked pop to its reserve call.
local OWED_MS = 20

-- waited_at reports whether v, the job of the list's entry at place at,
-- is ready there and has been for over a second (lib/entries.lua).
local function waited_at(v, at)
  return stranded_at(v, topic, at, now_ms)
end

local want = math.min(asked, held + left)
-- waiting: no signal is left, and a job heads the list, ready for under a
-- second, or may lie behind stale entries (the call says so rather than
-- that nothing is left). The stale entries before it are dropped.
local waiting, dropped, looked, status = false, 0, false, RESERVE_FILLED
if mode == RESERVE_GREEDY then
  want = asked
elseif want == 0 then
  local before, v, more = first_ready(ready, pool, topic, head, skips)
  dropped, looked = before, true
  if waited_at(v, head + before) then
    want = 1
  else
    waiting = v ~= nil or more
  end
  if more then
    status = RESERVE_STALE
  end
end

-- The IDs are read first and trimmed off the list last, after the jobs are
-- written: a script that fails half-way leaves the list as it was. An
-- entry stands for its job only at the job's place (lib/places.lua).
-- Each read takes one entry more than it needs: whether the list holds
-- more than the call takes (beyond) comes with it, not from an LLEN, and
-- so does the job behind the last one taken (behind), which the call looks
-- at when it leaves no signal for it.
local found, jobs = {}, {} -- jobs: encoded
local stale, taken, beyond, read, behind = dropped, dropped, waiting, looked, nil
while #found < want do
  read = true
  local more = want - #found
  local ids = redis.call('LRANGE', ready, taken, taken + more)
  local n = math.min(#ids, more)
  beyond = #ids > more
  if n > 0 then
    local vs = redis.call('HMGET', pool, unpack(ids))
    behind = vs[n + 1]
    for i = 1, n do
      local id, v = ids[i], vs[i]
      if at_place(v, topic, head + taken + i - 1) then
        found[#found + 1], jobs[#jobs + 1] = id, v
      else
        stale = stale + 1
      end
    end
  end
  taken = taken + n
  if not beyond then
    break
  end
  if stale >= skips and #found < want then
    status = RESERVE_STALE
    break
  end
end
if status == RESERVE_FILLED and #found < asked then
  status = RESERVE_RAN_OUT
end
if #found == 0 then
  -- An empty list may be the work of this call's first run.
  local reply = again(status)
  if reply then
    return reply
  end
  if taken > 0 then
    redis.call('LTRIM', ready, taken, -1)
    trimmed(taken, beyond, 0)
  end
  if left == 0 and (waiting or status == RESERVE_STALE) then
    return answer({status, RESERVE_NO_SIGNAL})
  elseif left == 0 and read and not beyond then
    return answer({status, RESERVE_DRY})
  end
  return answer({status, left})
end

-- The signals the call claims for the jobs it takes beyond those it
-- holds, and those it gives to other consumers of its caller's: the
-- record says how many it gave, for a second run to answer.
local claimed = math.max(math.min(#found - held, left), 0)
given = math.min(give, left - claimed)
local reservation = redis.call('INCRBY', reservations, #found) - #found
local before = redis.call('SET', record, record_of(status, reservation, found), 'PX', keep, 'GET')
if ours(before) then
  -- This call ran before: its record goes back, and the reservations
  -- just taken go unused.
  redis.call('SET', record, before, 'PX', keep)
  return answer(replay(before))
end

local out, fields, scores, first = {status, 0}, {}, {}, nil
for i, id in ipairs(found) do
  -- A copy of the job with a new header: reserved, one more attempt, a
  -- reservation of its own, until its TTR from now.
  local v = jobs[i]
  local t1, t2 = byte(v, 2, 3)
  local ttr = u32at(v, 6)
  local at = now_ms + ttr
  local enc = restate(v, RESERVED, at, t1 * 256 + t2 + 1, reservation + i)
  local grant = i <= grants_n and ARGV[grants_from + i - 1]
  if grant and grant ~= '' then
    keep_grant(KEYS[11], id, reservation + i, grant, ttr)
  end
  fields[2 * i - 1], fields[2 * i] = id, enc
  scores[2 * i - 1], scores[2 * i] = at, id
  out[3 * i], out[3 * i + 1], out[3 * i + 2] = id, enc, read48(v, AT)
  if first == nil or at < first then
    first = at
  end
end
redis.call('HSET', pool, unpack(fields))
redis.call('ZADD', bucket, unpack(scores))
if claimed + given > 0 then
  redis.call('LTRIM', signals, claimed + given, -1)
  left = left - claimed - given
end
redis.call('LTRIM', ready, taken, -1)
trimmed(taken, beyond, #found)
-- The signals given are the caller's: the jobs behind them have theirs.
-- A job left behind without a signal gets one, so that a waiting consumer
-- comes for it: when it has waited a second, or when the first job the
-- call took had waited over OWED_MS. That job was taken, oldest first, on
-- the signal of a later one, for its own went with a process that froze
-- or died as it took it; so the job behind is owed one too. Under a steady
-- flow of jobs none waits a second, and without this every later job of
-- the list would be taken on the signal of the job after it: late by as
-- many arrivals as signals were lost, until the flow paused.
if left + given == 0 and beyond and (waited_at(behind, head + taken) or now_ms - read48(jobs[1], AT) > OWED_MS) then
  signal_list(signals, 1)
  left = 1
end
out[2] = left
if left + given == 0 and beyond then
  out[2] = RESERVE_NO_SIGNAL -- no signal left for the jobs the list still holds
elseif left + given == 0 then
  out[2] = RESERVE_DRY
end
wake_if_first(bucket, pub, wake, first, now)
return answer(out)
