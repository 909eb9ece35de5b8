#!lua
--#include codec counts clock wake
-- schedule.lua: change schedules of one bucket, each only when it is still
-- as its caller read it (a compare-and-set): create, replace, pause,
-- resume, delete, and fire a tick. A schedule's jobs are in its own bucket
-- (their IDs are chosen so: schedule.go), so the change and the jobs it
-- pushes are one atomic step: two callers that read the same tick push its
-- jobs once, and a call run twice changes nothing the second time.
-- KEYS[1] schedules hash  KEYS[2] ticks zset  KEYS[3] last-ticks hash
-- KEYS[4] pool hash  KEYS[5] bucket zset  KEYS[6] counts hash
-- ARGV[1] wake channel  ARGV[2] publish command  ARGV[3] "1" to tell the
-- bucket handler when a new next tick is the bucket's earliest
-- ARGV[4..] per schedule: name, definition as read ("" none), next tick as
-- read (ms; "" none), new definition ("" deletes the schedule, "=" keeps
-- it), new next tick ("" none), last tick ("" keeps it), the ID of a job to
-- take back if it is still delayed and not due ("" none), n, then n times a
-- job ID and the job encoded as delayed, due at its at_ms
-- returns one integer per schedule: 1 changed, 0 not as read (unchanged)
-- A job is stored unless its ID holds a job that is no longer delayed: that
-- tick's job was delivered already.

local schedules, ticks, lasts, pool, bucket, counts = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local wake, pub, announce = ARGV[1], ARGV[2], ARGV[3]
local now = now_us()
local now_ms = floor(now / 1000)

-- as_read reports whether the schedule is as the caller read it.
local function as_read(name, def, next_read)
  if (redis.call('HGET', schedules, name) or '') ~= def then
    return false
  end
  local score = redis.call('ZSCORE', ticks, name)
  if score == false or next_read == '' then
    return score == false and next_read == ''
  end
  return tonumber(score) == tonumber(next_read)
end

-- take_back deletes the job with id when it is delayed and not yet due.
local function take_back(id)
  local v = redis.call('HGET', pool, id)
  local due = v and byte(v, 1) % 8 == DELAYED and redis.call('ZSCORE', bucket, id)
  if due and tonumber(due) > now_ms then
    redis.call('HDEL', pool, id)
    redis.call('ZREM', bucket, id)
    tally(counts, DELAYED, topic_of(v), -1)
  end
end

-- store makes the encoded job v delayed under id, due at its at_ms.
local function store(id, v)
  local held = redis.call('HGET', pool, id)
  if held and byte(held, 1) % 8 ~= DELAYED then
    return
  end
  if held then
    tally(counts, DELAYED, topic_of(held), -1)
  end
  local due = read48(v, AT)
  redis.call('HSET', pool, id, v)
  redis.call('ZADD', bucket, due, id)
  tally(counts, DELAYED, topic_of(v), 1)
  wake_if_first(bucket, pub, wake, due, now)
end

-- A schedule's answer, as schedule.go reads it.
local SCHEDULE_CHANGED = 1
local SCHEDULE_NOT_AS_READ = 0

local out = {}
local i = 4
while i <= #ARGV do
  local name, def, next_read, new_def = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local new_next, last, old, n = ARGV[i + 4], ARGV[i + 5], ARGV[i + 6], tonumber(ARGV[i + 7])
  local first = i + 8
  i = first + 2 * n
  if not as_read(name, def, next_read) then
    out[#out + 1] = SCHEDULE_NOT_AS_READ
  else
    if old ~= '' then
      take_back(old)
    end
    for k = 0, n - 1 do
      store(ARGV[first + 2 * k], ARGV[first + 2 * k + 1])
    end
    if new_def == '' then
      redis.call('HDEL', schedules, name)
      redis.call('ZREM', ticks, name)
      redis.call('HDEL', lasts, name)
    else
      if new_def ~= '=' then
        redis.call('HSET', schedules, name, new_def)
      end
      if new_next == '' then
        redis.call('ZREM', ticks, name)
      else
        redis.call('ZADD', ticks, new_next, name)
        local head = redis.call('ZRANGE', ticks, 0, 0)
        if announce == '1' and head[1] == name then
          redis.call(pub, wake, string.format('%d', math.max(0, tonumber(new_next) * 1000 - now)))
        end
      end
      if last ~= '' then
        redis.call('HSET', lasts, name, last)
      end
    end
    out[#out + 1] = SCHEDULE_CHANGED
  end
end
return out
