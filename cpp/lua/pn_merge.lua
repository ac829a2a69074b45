-- A PN-counter merge: for each (region, P or N) given, keep the larger of the stored and the
-- given total. Every argument and stored total is checked before anything is written, so a
-- bad call changes nothing.
-- KEYS[1] = the P hash, KEYS[2] = the N hash
-- ARGV = region, p, n, region, p, n, ... (p and n: non-negative decimals, no leading zeros)
-- Reply: how many fields were raised.
-- Totals may exceed 2^53, so they are compared as decimal strings, not as Lua numbers.
local function greater(a, b)
  if #a ~= #b then return #a > #b end
  for i = 1, #a do
    local x, y = a:byte(i), b:byte(i)
    if x ~= y then return x > y end
  end
  return false
end
local function canonical(s)
  return #s >= 1 and #s <= 19 and not s:find('%D') and (#s == 1 or s:byte(1) ~= 48)
    and not (#s == 19 and greater(s, '9223372036854775807'))
end
if #KEYS ~= 2 or #ARGV % 3 ~= 0 then return redis.error_reply('ERR pn_merge: malformed arguments') end
local order, latest = {}, {{}, {}}
for i = 1, #ARGV, 3 do
  local region = ARGV[i]
  for c = 1, 2 do
    local v = ARGV[i + c]
    if not canonical(v) then return redis.error_reply('ERR pn_merge: malformed arguments') end
    local cur = latest[c][region]
    if cur == nil then
      cur = redis.call('HGET', KEYS[c], region)
      if cur and not canonical(cur) then
        return redis.error_reply('ERR pn component is not a non-negative integer: ' .. KEYS[c])
      end
    end
    if greater(v, cur or '0') then
      if latest[c][region] == nil then order[#order + 1] = {c, region} end
      latest[c][region] = v
    end
  end
end
for _, f in ipairs(order) do redis.call('HSET', KEYS[f[1]], f[2], latest[f[1]][f[2]]) end
return #order
