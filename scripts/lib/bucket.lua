-- bucket.lua: a bucket's earliest job.

-- earliest returns the lowest score of a bucket, or nil when it is empty.
local function earliest(bucket)
  local head = redis.call('ZRANGE', bucket, 0, 0, 'WITHSCORES')
  if head[2] then
    return tonumber(head[2])
  end
  return nil
end
