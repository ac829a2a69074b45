-- Sliding-window counter: events, or distinct items, of the last `window` ms.
-- ARGV[1] = now in ms, or '' to read the server's TIME; ARGV[2] = op; ARGV[3] = window_ms;
-- ARGV[4] = amount (add) or item (unique); ARGV[5] = a unique id for the event's member.
-- 'add'/'count': KEYS[1] = sorted set of events (score = time, member = "time:id", or
--   "time:id*amount" for amount > 1), KEYS[2] = the extra weight of weighted members
--   (sum of amount - 1), a string that exists only while weighted members do.
-- 'unique'/'count-unique': KEYS[1] = sorted set of items (score = last time seen).
-- An event at time t counts while now - t < window. Writes trim what left the window and
-- set every written key's TTL to the window. Reply: the count (including this event).
local now = tonumber(ARGV[1])
if not now then
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local op, window = ARGV[2], tonumber(ARGV[3])
local cutoff = now - window
-- The reply of the first command on the sorted set, run with pcall: a foreign value of
-- another type in its place is garbage, deleted so the call starts afresh (nil then).
local function fresh(r)
  if type(r) == 'table' and r.err then
    redis.call('DEL', KEYS[1])
    return nil
  end
  return r
end
if op == 'unique' then
  fresh(redis.pcall('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff))
  redis.call('ZADD', KEYS[1], now, ARGV[4])
  redis.call('PEXPIRE', KEYS[1], window)
  return redis.call('ZCARD', KEYS[1])
end
if op == 'count-unique' then
  return fresh(redis.pcall('ZCOUNT', KEYS[1], cutoff + 1, '+inf')) or 0
end
-- the weight of events that left the window
local raw = redis.pcall('GET', KEYS[2])
local extra = 0
if raw and (type(raw) == 'table' or tonumber(raw) == nil) then
  redis.call('DEL', KEYS[2])  -- garbage in the weight's place: no weight known
  raw = false
end
if raw then
  extra = tonumber(raw)
  for _, m in ipairs(fresh(redis.pcall('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff)) or {}) do
    local w = string.match(m, '%*(%d+)$')
    if w then extra = extra - (tonumber(w) - 1) end
  end
end
if op == 'count' then
  return (fresh(redis.pcall('ZCOUNT', KEYS[1], cutoff + 1, '+inf')) or 0) + extra
end
-- op == 'add'
local amount = tonumber(ARGV[4])
fresh(redis.pcall('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff))
local member = string.format('%d', now) .. ':' .. ARGV[5]
if amount > 1 then
  member = member .. '*' .. string.format('%d', amount)
  extra = extra + amount - 1
end
redis.call('ZADD', KEYS[1], now, member)
redis.call('PEXPIRE', KEYS[1], window)
if extra > 0 then
  redis.call('SET', KEYS[2], string.format('%d', extra), 'PX', window)
elseif raw then
  redis.call('DEL', KEYS[2])
end
return redis.call('ZCARD', KEYS[1]) + extra
