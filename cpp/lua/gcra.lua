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
local tats, allowed = {}, 1
for i = 1, n do
  local interval, burst = tonumber(ARGV[2 + 2 * i]), tonumber(ARGV[3 + 2 * i])
  local raw = redis.call('GET', KEYS[i])
  local tat = tonumber(raw or '0')
  if tat == nil then
    return redis.error_reply('WRONGTYPE limiter key ' .. KEYS[i] .. ' does not hold a GCRA time')
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
  elseif hit and tats[i] > now and redis.call('PTTL', KEYS[i]) == -1 then
    redis.call('PEXPIRE', KEYS[i], math.ceil((tats[i] - now) / 1000))
  end
  reply[#reply + 1] = tats[i]
end
return reply
