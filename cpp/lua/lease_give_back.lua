-- Gives back the unused units of a leased fixed-window limit: takes up to ARGV[1] units
-- off each window key that still exists (a window that has ended has nothing to give back
-- to), never below zero (a reset may have cleared what the lease charged). Expiry is left
-- as it is.
-- ARGV[1] = units. KEYS = the lease's window keys.
-- Reply: the units taken off the first key.
local units = tonumber(ARGV[1])
if #ARGV ~= 1 or units == nil or units < 0 or math.floor(units) ~= units then
  return redis.error_reply('ERR lease_give_back: malformed arguments')
end
local first = 0
for i = 1, #KEYS do
  local c = tonumber(redis.pcall('GET', KEYS[i]) or '0')
  local take = 0
  if c ~= nil and c > 0 then
    take = math.min(units, c)
    redis.call('DECRBY', KEYS[i], take)
  end
  if i == 1 then first = take end
end
return first
