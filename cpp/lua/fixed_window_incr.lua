-- TTL-compensated fixed-window increment for a batch of counters that share a deadline.
-- KEYS[1..n]     counter keys; KEYS[n+1..n+m] request-id keys (only for items that have one)
-- ARGV[1] = n, ARGV[2] = the deadline (window end + grace, ms since the epoch)
-- ARGV[2+i] = amount of item i; ARGV[2+n+j] = the item (1..n) that request-id key j belongs to
-- Reply, per item: the count after the increment (a string when it is too big for a Lua
-- double to carry exactly), or an error reply for that item alone.
local n = tonumber(ARGV[1])
local deadline = ARGV[2]
-- Holds a key to the deadline: sets it when the key has no expiry (PERSIST, a foreign SET)
-- or a later one (a foreign PEXPIRE), so no key outlives its window + grace. PEXPIREAT LT
-- is that check and repair in one command (Redis >= 7.0); an older server refuses LT and
-- gets the missing-TTL repair only.
local function hold(key)
  if type(redis.pcall('PEXPIREAT', key, deadline, 'LT')) == 'table' and redis.call('PTTL', key) == -1 then
    redis.call('PEXPIREAT', key, deadline)
  end
end
local rid = {}
for j = 1, #KEYS - n do rid[tonumber(ARGV[2 + n + j])] = KEYS[n + j] end
local out = {}
for i = 1, n do
  local key = KEYS[i]
  local amount = ARGV[2 + i]
  local v
  if rid[i] and not redis.call('SET', rid[i], '1', 'NX', 'PXAT', deadline) then
    -- A repeat of a request id in this window: count nothing, still repair the TTLs of the
    -- id and of the count.
    hold(rid[i])
    hold(key)
    v = redis.pcall('GET', key) or '0'
  else
    v = redis.pcall('INCRBY', key, amount)
    if type(v) == 'table' then
      if rid[i] then redis.call('DEL', rid[i]) end  -- not counted, so the id is not used up
      hold(key)  -- a foreign value: the error stands, and the key still ends with its window
    else
      -- First increment of the window (no TTL yet), or a TTL lost to PERSIST, a foreign SET
      -- or a replica promotion, or stretched by a foreign PEXPIRE: the key gets its deadline.
      hold(key)
      if v >= 9007199254740992 then v = redis.call('GET', key) end
    end
  end
  out[i] = v
end
return out
