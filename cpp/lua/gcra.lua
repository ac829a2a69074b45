-- GCRA (generic cell rate algorithm) rate limit over one or more limits, all or nothing.
-- KEYS[i]: limit i's theoretical arrival time (TAT), in microseconds since the epoch.
-- ARGV[1] = now in microseconds, or '' to read the server's TIME; ARGV[2] = 'hit' or
-- 'test'; ARGV[3] = cost; then per limit i: ARGV[2 + 2i] = emission interval T in
-- microseconds (window / amount, rounded up), ARGV[3 + 2i] = burst.
-- A hit is allowed when max(TAT, now) + cost * T - now <= burst * T; it moves TAT there.
-- Reply: {now, allowed, then per limit: TAT after this hit when charged (>= now)}.
local now = tonumber(ARGV[1])
if not now then
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
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
local tats, allowed = {}, 1
for i = 1, n do
  local interval, burst = tonumber(ARGV[2 + 2 * i]), tonumber(ARGV[3 + 2 * i])
  local tat = tonumber(redis.pcall('GET', KEYS[i]) or '0')
  if tat == nil then
    -- A foreign value (another type, or no number) is garbage: start afresh.
    redis.call('DEL', KEYS[i])
    tat = 0
  end
  if tat < now then tat = now end
  tats[i] = tat
  if tat + cost * interval - now > burst * interval then allowed = 0 end
end
local reply = {now, allowed}
for i = 1, n do
  local interval = tonumber(ARGV[2 + 2 * i])
  if allowed == 1 and hit then
    tats[i] = tats[i] + cost * interval
    redis.call('SET', KEYS[i], string.format('%d', tats[i]), 'PX', math.ceil((tats[i] - now) / 1000))
  elseif hit then
    -- A refused hit still repairs a key that lost its TTL or was given a longer one: it
    -- lives until its arrival time (a time already past holds nothing: 1 ms).
    local ttl = math.max(1, math.ceil((tats[i] - now) / 1000))
    local left = redis.call('PTTL', KEYS[i])
    if left == -1 or left > ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
  end
  reply[#reply + 1] = tats[i]
end
return reply
