--#include header
-- decode.lua: a whole job as a table: decode reads an encoded job into one,
-- encode writes it back. The headers are carried over as they are, never
-- read.

local function u16(n)
  return char(floor(n / 256) % 256, n % 256)
end

local function u32(n)
  return char(floor(n / 16777216) % 256, floor(n / 65536) % 256, floor(n / 256) % 256, n % 256)
end

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
