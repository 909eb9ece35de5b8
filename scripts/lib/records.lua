-- records.lua: the records of answered reserve calls (reserve.lua), which a
-- script of the settling kind (reserve, finish, retry, release, touch) is
-- given after its own keys, to delete.

-- forget_records deletes the records, from KEYS[first] on.
local function forget_records(first)
  if #KEYS >= first then
    redis.call('DEL', unpack(KEYS, first))
  end
end
