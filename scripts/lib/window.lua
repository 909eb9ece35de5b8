--#include codec
-- window.lua: a job's dedup window (tombstones.lua).

-- has_window reports whether an encoded job has a window, from its flags
-- alone.
local function has_window(v)
  return floor(byte(v, 1) / HAS_WINDOW) % 2 == 1
end

-- window_of reads an encoded job's dedup window, 0 for none.
local function window_of(v)
  local _, w = optional(v)
  if not w then
    return 0
  end
  return u32at(v, w)
end
