--#include codec
-- due.lua: the due time of a job delayed from now.

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
