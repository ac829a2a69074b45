-- Approximate sliding-window rate limit (weighted sub-buckets), all or nothing.
-- KEYS[i]: limit i's hash of sub-bucket counts; field = the sub-bucket's index since the
-- epoch (index = floor(t / bucket_ms)), value = hits charged in it.
-- ARGV[1] = now in ms, or '' to read the server's TIME; ARGV[2] = 'hit' or 'test';
-- ARGV[3] = cost; then per limit i: ARGV[1 + 3i] = amount, ARGV[2 + 3i] = bucket_ms,
-- ARGV[3 + 3i] = k, the sub-buckets per window (window = k * bucket_ms).
-- Estimate at now, with cur = floor(now / bucket_ms) and e = now - cur * bucket_ms:
--   sum of sub-buckets cur-k+1 .. cur  +  count(cur-k) * (bucket_ms - e) / bucket_ms,
-- compared in integers (everything times bucket_ms), so Lua and C++ agree exactly.
-- Reply: {now, allowed, then per limit: the k+1 counts of sub-buckets cur-k .. cur}
-- (after this hit when it was charged).
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
local all, allowed = {}, 1
for i = 1, n do
  local amount, bucket, k = tonumber(ARGV[1 + 3 * i]), tonumber(ARGV[2 + 3 * i]), tonumber(ARGV[3 + 3 * i])
  local cur = math.floor(now / bucket)
  local c = {}
  for off = 0, k do c[off] = 0 end
  local fields = redis.pcall('HGETALL', KEYS[i])
  if fields.err then
    redis.call('DEL', KEYS[i])  -- a foreign value of another type is garbage: start afresh
    fields = {}
  end
  for f = 1, #fields, 2 do
    local idx = tonumber(fields[f])
    local v = tonumber(fields[f + 1])
    if idx and v and idx >= cur - k and idx <= cur then
      c[idx - cur + k] = v
    elseif hit and (not idx or not v or idx < cur - k) then
      redis.call('HDEL', KEYS[i], fields[f])  -- a sub-bucket that left the window
    end
  end
  local scaled = c[0] * (bucket - (now - cur * bucket))
  for off = 1, k do scaled = scaled + c[off] * bucket end
  if scaled + cost * bucket > amount * bucket then allowed = 0 end
  all[i] = {c, cur, bucket, k}
end
local reply = {now, allowed}
for i = 1, n do
  local c, cur, bucket, k = all[i][1], all[i][2], all[i][3], all[i][4]
  if allowed == 1 and hit then
    c[k] = redis.call('HINCRBY', KEYS[i], string.format('%d', cur), cost)
    -- sub-bucket cur still weighs in until the end of sub-bucket cur + k
    redis.call('PEXPIRE', KEYS[i], (cur + k + 1) * bucket - now)
  elseif hit then
    -- A refused hit repairs a key that lost its TTL or was given a longer one.
    local ttl = (cur + k + 1) * bucket - now
    local left = redis.call('PTTL', KEYS[i])
    if left == -1 or left > ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
  end
  for off = 0, k do reply[#reply + 1] = c[off] end
end
return reply
