-- Fixed-window rate-limit hit over one or more limits, all or nothing.
-- ARGV[1] = cost; then per limit i: limit_i, expire_at_ms_i. KEYS[i] = limit i's window key.
-- Reply: {allowed (1/0), count_1, ..., count_n}: counts after the hit when allowed, the
-- unchanged counts when denied. A denied hit stores nothing.
local cost = tonumber(ARGV[1])
local n = #KEYS
-- A penalty's gate: with 'gate:<g>' as the last ARGV, the last g KEYS are penalty block
-- keys (<prefix>:pen:{key}:b, in the same slot as the limits' keys). While any of them
-- lives, nothing is read or written and the reply is {-1, the longest block's PTTL in ms}.
local gate = ARGV[#ARGV]
if type(gate) == 'string' and string.sub(gate, 1, 5) == 'gate:' then
  local g = tonumber(string.sub(gate, 6))
  if not g or g < 1 or g > n or g % 1 ~= 0 then return redis.error_reply('ERR gate: malformed') end
  n = n - g
  local longest = 0
  for j = n + 1, n + g do
    local left = redis.call('PTTL', KEYS[j])
    if left > longest then longest = left end
  end
  if longest > 0 then return {-1, longest} end
end
local counts = {}
local allowed = 1
-- Holds a key to its window's end + 1 s (see fixed_window_incr.lua: LT needs Redis 7.0).
local function hold(key, at)
  if type(redis.pcall('PEXPIREAT', key, at, 'LT')) == 'table' and redis.call('PTTL', key) == -1 then
    redis.call('PEXPIREAT', key, at)
  end
end
-- One limit (the common case): count first and take the count back when it is over. This
-- gives the same replies and stored state as the general path below with one command less
-- on an allowed hit. Only where the arithmetic is exact: a cost within the limit (so a
-- denied hit found a count of at least 1, restored exactly) and counts below 2^53.
if n == 1 then
  local limit = tonumber(ARGV[2])
  if cost >= 0 and cost <= limit then
    local key = KEYS[1]
    local c = redis.pcall('INCRBY', key, ARGV[1])
    if type(c) == 'number' then
      if c < 9007199254740992 and c > -9007199254740992 then
        if c <= limit then
          hold(key, ARGV[3])
          return {1, c}
        end
        redis.call('DECRBY', key, ARGV[1])
        hold(key, ARGV[3])
        return {0, c - cost}
      end
      redis.call('DECRBY', key, ARGV[1])  -- past 2^53: undone, and decided below
    end
    -- An error (a foreign value, an overflow) changed nothing: decided below.
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
