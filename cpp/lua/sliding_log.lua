-- Exact sliding-log rate limit over one or more limits, all or nothing.
-- KEYS[i]: limit i's sorted set of admitted hits (score = time in ms, member unique).
-- ARGV[1] = now in ms, or '' to read the server's TIME; ARGV[2] = 'hit', 'test' or
-- 'lease:<at>' (a hit whose entries are stamped <at> >= now instead of now: the units of a
-- lease, admitted in the process until <at>, so that every window containing one of their
-- admissions counts them);
-- ARGV[3] = cost; ARGV[4] = a unique id for this call's members;
-- then per limit i: ARGV[3 + 2i] = amount, ARGV[4 + 2i] = window in ms.
-- A hit at time t counts while now - t < window (an entry stamped ahead counts from when it
-- is added). The hit is checked before anything is added, so a refused hit stores nothing
-- and a set never holds more than `amount` hits. A set lives until its newest entry leaves
-- the window: a hit never shortens that.
-- Reply: {now, allowed, then per limit: count, newest, need_at}: count = hits in the
-- window (after this hit when it was charged), newest = time of the newest of them (0 if
-- none), need_at = for a limit that refuses `cost`, the time from which it would allow it.
local now = tonumber(ARGV[1])
if not now then
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local hit = ARGV[2] == 'hit'
local stamp_at = now
if string.sub(ARGV[2], 1, 6) == 'lease:' then
  hit = true
  stamp_at = tonumber(string.sub(ARGV[2], 7))
  if not stamp_at or stamp_at < now or stamp_at % 1 ~= 0 then return redis.error_reply('ERR sliding_log: malformed arguments') end
end
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
local counts, allowed = {}, 1
for i = 1, n do
  local amount, window = tonumber(ARGV[3 + 2 * i]), tonumber(ARGV[4 + 2 * i])
  local from = now - window + 1
  if hit then
    if type(redis.pcall('ZREMRANGEBYSCORE', KEYS[i], '-inf', from - 1)) == 'table' then
      redis.call('DEL', KEYS[i])  -- a foreign value of another type is garbage: start afresh
    end
    counts[i] = redis.call('ZCARD', KEYS[i])
  else
    counts[i] = redis.pcall('ZCOUNT', KEYS[i], from, '+inf')
    if type(counts[i]) == 'table' then
      redis.call('DEL', KEYS[i])
      counts[i] = 0
    end
  end
  if counts[i] + cost > amount then allowed = 0 end
end
local reply = {now, allowed}
local stamp = string.format('%d', now) .. ':' .. ARGV[4] .. ':'
-- The time of the newest entry of a set that holds some.
local function newest_of(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  return tonumber(last[2])
end
for i = 1, n do
  local amount, window = tonumber(ARGV[3 + 2 * i]), tonumber(ARGV[4 + 2 * i])
  local from = now - window + 1
  local need_at = 0
  if allowed == 1 and hit then
    local j = 1
    while j <= cost do
      local args = {}
      local last = math.min(cost, j + 255)
      for m = j, last do
        args[#args + 1] = stamp_at
        args[#args + 1] = stamp .. m
      end
      redis.call('ZADD', KEYS[i], unpack(args))
      j = last + 1
    end
    counts[i] = counts[i] + cost
    -- Until the newest entry leaves the window (a lease's, stamped ahead, may be newer).
    redis.call('PEXPIRE', KEYS[i], math.max(window, newest_of(KEYS[i]) - now + window))
  else
    if hit and counts[i] > 0 then
      -- A set that lost its TTL would live forever, one given a longer one would outlive
      -- its newest entry's window: give it back that.
      local keep = math.max(window, newest_of(KEYS[i]) - now + window)
      local left = redis.call('PTTL', KEYS[i])
      if left == -1 or left > keep then redis.call('PEXPIRE', KEYS[i], keep) end
    end
    if counts[i] + cost > amount then
      local gone = redis.call('ZRANGEBYSCORE', KEYS[i], from, '+inf', 'WITHSCORES', 'LIMIT',
                              counts[i] + cost - amount - 1, 1)
      need_at = tonumber(gone[2]) + window
    end
  end
  local newest = 0
  if allowed == 1 and hit then
    newest = stamp_at  -- just added (a faster client's later entries make reset_after at most shorter)
  elseif counts[i] > 0 then
    local last = redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')
    newest = tonumber(last[2])
  end
  reply[#reply + 1] = counts[i]
  reply[#reply + 1] = newest
  reply[#reply + 1] = need_at
end
return reply
