-- job.lua: the encoding of a job in the pool, shared by every script.
-- Prepended to each script at load time; defines no keys and reads no ARGV.
-- A job is stored as seven header fields and the body, joined by "\n":
--   version, state, attempts, max_attempts, ttr_ms, at_ms, topic, body
-- The body comes last and is never split, so it may hold any bytes.
-- at_ms is the job's score in its bucket while it is there (due time when
-- delayed, lease deadline when reserved) and the time it became ready or dead
-- otherwise.

local DELAYED, READY, RESERVED, DEAD = '1', '2', '3', '4'

local function decode(v)
  local f, pos = {}, 1
  for i = 1, 7 do
    local j = string.find(v, '\n', pos, true)
    f[i] = string.sub(v, pos, j - 1)
    pos = j + 1
  end
  return {
    state = f[2],
    attempts = tonumber(f[3]),
    max = tonumber(f[4]),
    ttr = tonumber(f[5]),
    at = tonumber(f[6]),
    topic = f[7],
    body = string.sub(v, pos),
  }
end

local function encode(j)
  return table.concat({
    '1', j.state,
    string.format('%d', j.attempts),
    string.format('%d', j.max),
    string.format('%d', j.ttr),
    string.format('%d', j.at),
    j.topic, j.body,
  }, '\n')
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
