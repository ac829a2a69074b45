-- Token-bucket rate limit over one or more limits, all or nothing.
-- KEYS[i]: limit i's hash {tokens, ts}. Tokens are kept in units of 1/window_ms of a
-- token, so a refill of `amount` tokens per window is exactly `amount` units per ms.
-- ARGV[1] = now in ms, or '' to read the server's TIME; ARGV[2] = 'hit' or 'test';
-- ARGV[3] = cost; then per limit i: ARGV[1 + 3i] = amount, ARGV[2 + 3i] = window_ms,
-- ARGV[3 + 3i] = capacity (tokens). A missing key is a full bucket.
-- The hash also keeps `cap`, the capacity (in units) its tokens were counted against: when
-- the limit's capacity changes, the tokens used are kept, so the level moves with the
-- capacity (clamped to [0, capacity]); the amount is not part of the key.
-- Reply: {now, allowed, then per limit: tokens (units) after this hit when charged}.
local now = tonumber(ARGV[1])
if not now then
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local hit = ARGV[2] == 'hit'
local cost = tonumber(ARGV[3])
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
local level, allowed = {}, 1
for i = 1, n do
  local amount, window, cap = tonumber(ARGV[1 + 3 * i]), tonumber(ARGV[2 + 3 * i]), tonumber(ARGV[3 + 3 * i])
  local full = cap * window
  local v = redis.pcall('HMGET', KEYS[i], 'tokens', 'ts', 'cap')
  if v.err then
    -- A foreign value of another type is garbage: start afresh (a full bucket).
    redis.call('DEL', KEYS[i])
    v = {}
  end
  local tokens, ts = tonumber(v[1]), tonumber(v[2])
  local was = tonumber(v[3])
  if not tokens or not ts or tokens < 0 then
    tokens = full
  else
    if was and was ~= full then
      tokens = tokens + full - was  -- the same tokens used under the new capacity
      if tokens < 0 then tokens = 0 end
    end
    if tokens > full then tokens = full end
    if now > ts then
      if now - ts >= math.ceil((full - tokens) / amount) then
        tokens = full
      else
        tokens = tokens + (now - ts) * amount
      end
    end
  end
  if tokens > full then tokens = full end
  level[i] = tokens
  if tokens < cost * window then allowed = 0 end
end
local reply = {now, allowed}
for i = 1, n do
  local amount, window, cap = tonumber(ARGV[1 + 3 * i]), tonumber(ARGV[2 + 3 * i]), tonumber(ARGV[3 + 3 * i])
  local full = cap * window
  if allowed == 1 and hit then
    level[i] = level[i] - cost * window
    redis.call('HSET', KEYS[i], 'tokens', string.format('%d', level[i]), 'ts', string.format('%d', now), 'cap',
               string.format('%d', full))
    -- an absent key reads as a full bucket: let it go when the bucket would be full
    redis.call('PEXPIRE', KEYS[i], math.max(1, math.ceil((full - level[i]) / amount)))
  elseif hit then
    -- A refused hit repairs a key that lost its TTL or was given a longer one.
    local ttl = math.max(1, math.ceil((full - level[i]) / amount))
    local left = redis.call('PTTL', KEYS[i])
    if left == -1 or left > ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
  end
  reply[#reply + 1] = level[i]
end
return reply
