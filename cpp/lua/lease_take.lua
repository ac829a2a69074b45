-- Takes a lease for a leased fixed-window limit: charges g units against every limit at
-- once, where g = min(most, floor(remaining / 2)) but at least `least` (the units the
-- asking hit still needs), and remaining is the fewest units any limit has left. So a
-- lease shrinks as the window fills, and a process never holds more than half of what was
-- left when it asked. Nothing is charged when fewer than `least` units are left.
-- ARGV[1] = least, ARGV[2] = most; then per limit i: limit_i, expire_at_ms_i.
-- KEYS[i] = limit i's window key.
-- Reply: {granted (0 = refused), count_1, ..., count_n}: the counts after the charge, or
-- the unchanged counts when refused.
local least = tonumber(ARGV[1])
local most = tonumber(ARGV[2])
local n = #KEYS
local counts = {}
local remaining = nil
-- Holds a key to its window's end + 1 s (as fixed_window_hit.lua does).
local function hold(key, at)
  if type(redis.pcall('PEXPIREAT', key, at, 'LT')) == 'table' and redis.call('PTTL', key) == -1 then
    redis.call('PEXPIREAT', key, at)
  end
end
for i = 1, n do
  local c = tonumber(redis.pcall('GET', KEYS[i]) or '0')
  if c == nil then
    -- A foreign value (another type, or no number) is garbage: start the window afresh.
    redis.call('DEL', KEYS[i])
    c = 0
  end
  counts[i] = c
  local left = tonumber(ARGV[2 * i + 1]) - c
  if remaining == nil or left < remaining then remaining = left end
end
local granted = 0
if remaining ~= nil and remaining >= least then
  granted = math.min(most, math.floor(remaining / 2))
  if granted < least then granted = least end
end
for i = 1, n do
  if granted > 0 then counts[i] = redis.call('INCRBY', KEYS[i], granted) end
  hold(KEYS[i], ARGV[2 * i + 2])
end
local reply = {granted}
for i = 1, n do reply[i + 1] = counts[i] end
return reply
