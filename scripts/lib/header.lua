--#include codec
-- header.lua: writing an encoded job's 22-byte header (see the table in
-- codec.go): the one place in Lua that lays it out.

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

-- header writes a job's header. It makes one string with one string.char:
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
