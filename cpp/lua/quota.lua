-- A quota's take or give: one key, refused (changing nothing) when it would cross the floor
-- or the ceiling; with a request id, a repeat of an applied call changes nothing.
-- KEYS[1] = the quota key; KEYS[2] = the request-id key (only with a request id)
-- ARGV[1] = 'take' or 'give', ARGV[2] = n (> 0), ARGV[3] = floor, ARGV[4] = ceiling,
-- ARGV[5] = request-id lifetime (ms); for a quota reset by a calendar, also
-- ARGV[6] = the value a period starts at (the key is the period's), ARGV[7] = the period's
-- end plus grace (ms since the epoch), the key's deadline
-- Reply: {applied 1/0, the value after the call, 1 when it was a repeat of the request id}.
local key, rid = KEYS[1], KEYS[2]
local op, n, floor, ceiling = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local start, expire_at = ARGV[6], ARGV[7]
local raw = redis.call('GET', key)
local cur = tonumber(raw or start or '0')
if cur == nil or math.floor(cur) ~= cur or math.abs(cur) > 9007199254740991 then
  return redis.error_reply('ERR quota value is not an integer: ' .. key)
end
if rid and redis.call('EXISTS', rid) == 1 then return {1, cur, 1} end
local after
if op == 'take' then
  after = cur - n
  if after < floor then return {0, cur, 0} end
else
  after = cur + n
  if after > ceiling then return {0, cur, 0} end
end
if not raw and start then redis.call('SET', key, start) end
redis.call('INCRBY', key, op == 'take' and -n or n)
if expire_at then redis.call('PEXPIREAT', key, expire_at) end
if rid then redis.call('SET', rid, '1', 'PX', ARGV[5]) end
return {1, after, 0}
