-- Gives back the unused units of a lease: takes up to ARGV[1] units off each key's count
-- where it still exists (a window that has ended has nothing to give back to), never below
-- zero (a reset may have cleared what the lease charged). Expiry is left as it is.
-- Fixed window: KEYS = the lease's window keys (strings), ARGV = {units}.
-- Approximate sliding window: KEYS = the limits' hashes of sub-bucket counts, ARGV = {units,
-- then per key the field (sub-bucket index) the lease charged}.
-- Reply: the units taken off the first key.
local units = tonumber(ARGV[1])
local fields = #ARGV == #KEYS + 1 and #KEYS > 0
if (#ARGV ~= 1 and not fields) or units == nil or units < 0 or math.floor(units) ~= units then
  return redis.error_reply('ERR lease_give_back: malformed arguments')
end
local first = 0
for i = 1, #KEYS do
  local c
  if fields then
    local v = redis.pcall('HGET', KEYS[i], ARGV[i + 1])
    c = type(v) == 'string' and tonumber(v) or nil
  else
    c = tonumber(redis.pcall('GET', KEYS[i]) or '0')
  end
  local take = 0
  if c ~= nil and c > 0 then
    take = math.min(units, c)
    if fields then
      redis.call('HINCRBY', KEYS[i], ARGV[i + 1], -take)
    else
      redis.call('DECRBY', KEYS[i], take)
    end
  end
  if i == 1 then first = take end
end
return first
