-- signals.lua: ready signals. Beside each ready list, the bucket keeps a
-- list of signals of the same topic, one per job made ready and not yet
-- claimed (keys.go: dq:{name:b}:sig:<topic>). A waiting consumer blocks on
-- it (BLPOP): Redis hands each signal to exactly one of them, whichever
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
