-- Fixed-window rate-limit hit over one or more limits, all or nothing.
-- ARGV[1] = cost; then per limit i: limit_i, expire_at_ms_i. KEYS[i] = limit i's window key.
-- Reply: {allowed (1/0), count_1, ..., count_n}: counts after the hit when allowed, the
-- unchanged counts when denied. A denied hit stores nothing.
local cost = tonumber(ARGV[1])
local n = #KEYS
local counts = {}
local allowed = 1
-- Holds a key to its window's end + 1 s (see fixed_window_incr.lua: LT needs Redis 7.0).
local function hold(key, at)
  if type(redis.pcall('PEXPIREAT', key, at, 'LT')) == 'table' and redis.call('PTTL', key) == -1 then
    redis.call('PEXPIREAT', key, at)
  end
end
for i = 1, n do
  local raw = redis.pcall('GET', KEYS[i])
  local c = tonumber(raw or '0')
  if c == nil then
    -- A foreign value (another type, or no number) is garbage: start the window afresh.
    redis.call('DEL', KEYS[i])
    c = 0
  end
  counts[i] = c
  if c + cost > tonumber(ARGV[2 * i]) then allowed = 0 end
end
for i = 1, n do
  if allowed == 1 then
    counts[i] = redis.call('INCRBY', KEYS[i], cost)
    hold(KEYS[i], ARGV[2 * i + 1])
  else
    -- A key that lost its TTL (whatever it holds) would deny this client forever, or one
    -- given a far one for longer than its window: give it back its deadline.
    hold(KEYS[i], ARGV[2 * i + 1])
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
