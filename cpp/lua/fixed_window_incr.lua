-- TTL-compensated fixed-window increment for a batch of counters.
-- ARGV[1] = number of items n; then per item: amount, expire_at_ms, has_request_id (0/1).
-- KEYS, per item: counter key, then the request-id key when has_request_id is 1.
-- Per item the reply is the count after the increment (a string when it is too big for
-- a Lua double to carry exactly), or an error reply for that item alone.
local n = tonumber(ARGV[1])
local out = {}
local k = 1
for i = 1, n do
  local a = 1 + (i - 1) * 3
  local amount = ARGV[a + 1]
  local expire_at = ARGV[a + 2]
  local key = KEYS[k]
  local rid = nil
  k = k + 1
  if ARGV[a + 3] == '1' then
    rid = KEYS[k]
    k = k + 1
  end
  local fresh = true
  if rid then
    fresh = redis.call('SET', rid, '1', 'NX', 'PXAT', expire_at)
  end
  local v
  if fresh then
    v = redis.pcall('INCRBY', key, amount)
    if type(v) == 'table' and v.err then
      if rid then redis.call('DEL', rid) end
    elseif v == tonumber(amount) or redis.call('PTTL', key) == -1 then
      -- First increment of the window, or a TTL lost to PERSIST, a foreign SET or a
      -- replica promotion: either way the key gets its deadline (back).
      redis.call('PEXPIREAT', key, expire_at)
    end
  else
    -- A duplicate request id: count nothing, but still repair a lost TTL.
    if redis.call('PTTL', key) == -1 then redis.call('PEXPIREAT', key, expire_at) end
    v = redis.call('GET', key) or '0'
  end
  if type(v) == 'number' and v >= 9007199254740992 then
    v = redis.call('GET', key)
  end
  out[i] = v
end
return out
