-- codec.lua: reading an encoded job in the pool: the states, the header's
-- layout and the optional fields. The layout of an encoded job is described
-- once, in the table beside the Go codec (codec.go, encodeJob); header.lua
-- writes the header, decode.lua reads and writes a whole job.
-- at_ms is the reservation deadline of a reserved job (its score in its
-- bucket), and the time a ready or dead job became so. A delayed job's due
-- time is its score in its bucket; its at_ms is not read (push.lua leaves it
-- 0 for a job pushed with a delay, sparing a copy of the job).
-- reservation numbers the job's reservations: a consumer proves it still
-- holds the job by the number it was given. A ready job needs no number:
-- there the field holds its place in its ready list (places.lua).

local DELAYED, READY, RESERVED, DEAD = 1, 2, 3, 4
local FORMAT = 128 -- the marker bit
local HAS_HEADERS = 64
local HAS_NONCE = 32
local HAS_WINDOW = 16
local HAS_ERROR = 8
local HEADER = 22

local floor, byte, char, sub = math.floor, string.byte, string.char, string.sub

-- Positions (from 1, as Lua counts) of the 6-byte fields.
local AT, RESERVATION = 10, 16

-- read48 reads the 6-byte number at position from of an encoded job.
local function read48(v, from)
  local a1, a2, a3, a4, a5, a6 = byte(v, from, from + 5)
  return ((((a1 * 256 + a2) * 256 + a3) * 256 + a4) * 256 + a5) * 256 + a6
end

-- u32at reads the 4-byte number at position pos.
local function u32at(v, pos)
  local a, b, c, d = byte(v, pos, pos + 3)
  return ((a * 256 + b) * 256 + c) * 256 + d
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
