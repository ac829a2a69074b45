-- Fixed-window rate-limit hit over one or more limits, all or nothing.
-- ARGV[1] = cost; then per limit i: limit_i, expire_at_ms_i. KEYS[i] = limit i's window key.
-- Reply: {allowed (1/0), count_1, ..., count_n}: counts after the hit when allowed, the
-- unchanged counts when denied. A denied hit stores nothing.
local cost = tonumber(ARGV[1])
local n = #KEYS
local counts = {}
local allowed = 1
for i = 1, n do
  local c = tonumber(redis.call('GET', KEYS[i]) or '0')
  if c == nil then
    return redis.error_reply('WRONGTYPE limiter key ' .. KEYS[i] .. ' does not hold a counter')
  end
  counts[i] = c
  if c + cost > tonumber(ARGV[2 * i]) then allowed = 0 end
end
for i = 1, n do
  if allowed == 1 then
    counts[i] = redis.call('INCRBY', KEYS[i], cost)
    if counts[i] == cost or redis.call('PTTL', KEYS[i]) == -1 then
      redis.call('PEXPIREAT', KEYS[i], ARGV[2 * i + 1])
    end
  elseif counts[i] > 0 and redis.call('PTTL', KEYS[i]) == -1 then
    -- A key that lost its TTL would deny this client forever; give it back its deadline.
    redis.call('PEXPIREAT', KEYS[i], ARGV[2 * i + 1])
  end
end
local reply = {allowed}
for i = 1, n do
  -- Lua numbers are doubles: a count past 2^53 (only a foreign write makes one) goes back
  -- as the exact string the key holds.
  if counts[i] >= 9007199254740992 or counts[i] <= -9007199254740992 then
    reply[i + 1] = redis.call('GET', KEYS[i])
  else
    reply[i + 1] = counts[i]
  end
end
return reply
