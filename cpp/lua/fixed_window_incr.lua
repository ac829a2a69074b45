-- TTL-compensated fixed-window increment for a batch of counters that share a deadline.
-- KEYS[1..n]     counter keys; KEYS[n+1..n+m] request-id keys (only for items that have one)
-- ARGV[1] = n, ARGV[2] = the deadline (window end + grace, ms since the epoch)
-- ARGV[2+i] = amount of item i; ARGV[2+n+j] = the item (1..n) that request-id key j belongs to
-- Reply, per item: the count after the increment (a string when it is too big for a Lua
-- double to carry exactly), or an error reply for that item alone.
local n = tonumber(ARGV[1])
local deadline = ARGV[2]
local rid = {}
for j = 1, #KEYS - n do rid[tonumber(ARGV[2 + n + j])] = KEYS[n + j] end
local out = {}
for i = 1, n do
  local key = KEYS[i]
  local amount = ARGV[2 + i]
  local v
  if rid[i] and not redis.call('SET', rid[i], '1', 'NX', 'PXAT', deadline) then
    -- A repeat of a request id in this window: count nothing, still repair a lost TTL.
    if redis.call('PTTL', key) == -1 then redis.call('PEXPIREAT', key, deadline) end
    v = redis.call('GET', key) or '0'
  else
    v = redis.pcall('INCRBY', key, amount)
    if type(v) == 'table' then
      if rid[i] then redis.call('DEL', rid[i]) end  -- not counted, so the id is not used up
    else
      -- First increment of the window, or a TTL lost to PERSIST, a foreign SET or a
      -- replica promotion: either way the key gets its deadline (back).
      if v == tonumber(amount) or redis.call('PTTL', key) == -1 then
        redis.call('PEXPIREAT', key, deadline)
      end
      if v >= 9007199254740992 then v = redis.call('GET', key) end
    end
  end
  out[i] = v
end
return out
