-- Concurrency limit: at most `max` leases in flight per key.
-- KEYS[1]: the key's sorted set of leases (member = lease id, score = expiry in ms).
-- ARGV[1] = now in ms, or '' to read the server's TIME;
-- ARGV[2] = 'acquire', 'test' or 'release'; ARGV[3] = max in flight;
-- ARGV[4] = lease timeout in ms; ARGV[5] = lease id; ARGV[6] = cost (leases to take).
-- A lease counts while its expiry is after now. 'acquire' takes `cost` leases (members
-- id, or id:1..id:cost when cost > 1) if they fit; 'release' removes them.
-- Reply: {now, ok, count, need_at, latest}: ok = taken / fits / was held; count = leases in
-- flight after the call; need_at = when a refused acquire would fit (0 otherwise);
-- latest = the last expiry in flight (0 when none).
local now = tonumber(ARGV[1])
if not now then
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local op, max, timeout, id, cost = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local key = KEYS[1]
local ok, need_at = 0, 0
local function member(j)
  if cost == 1 then return id end
  return id .. ':' .. j
end
local count = redis.pcall('ZCOUNT', key, '(' .. string.format('%d', now), '+inf')
if type(count) == 'table' then
  redis.call('DEL', key)  -- a foreign value of another type is garbage: start afresh
  count = 0
end
if op == 'acquire' then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
end
if op == 'release' then
  for j = 1, cost do ok = ok + redis.call('ZREM', key, member(j)) end
  if ok > 0 then ok = 1 end
  count = redis.call('ZCOUNT', key, '(' .. string.format('%d', now), '+inf')
elseif count + cost <= max then
  ok = 1
  if op == 'acquire' then
    for j = 1, cost do redis.call('ZADD', key, now + timeout, member(j)) end
    count = count + cost
  end
else
  local gone = redis.call('ZRANGEBYSCORE', key, '(' .. string.format('%d', now), '+inf', 'WITHSCORES', 'LIMIT',
                          count + cost - max - 1, 1)
  need_at = tonumber(gone[2])
end
local latest = 0
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if last[2] and tonumber(last[2]) > now then latest = tonumber(last[2]) end
if latest > 0 and op ~= 'test' then
  -- the set lives as long as its last lease (and no longer than that): set on a change,
  -- repaired otherwise when it was lost or stretched by a foreign write
  if ok == 1 then
    redis.call('PEXPIRE', key, latest - now)
  else
    local left = redis.call('PTTL', key)
    if left == -1 or left > latest - now then redis.call('PEXPIRE', key, latest - now) end
  end
end
return {now, ok, count, need_at, latest}
