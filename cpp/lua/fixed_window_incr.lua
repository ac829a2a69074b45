-- TTL-compensated fixed-window increment for a batch of counters that share a deadline.
-- KEYS[1..n]     counter keys; KEYS[n+1..n+m] request-id keys (only for items that have one)
-- ARGV[1] = n, ARGV[2] = the deadline (window end + grace, ms since the epoch), then the
-- amounts: ARGV[2+i] = amount of item i, or, when every item adds the same, ARGV[3] alone
-- (a batch of n keys then sends, parses and interns n - 1 fewer arguments); then
-- ARGV[a+j] = the item (1..n) that request-id key j belongs to. The two forms differ in
-- length except for n = 1, where they are the same.
-- Reply, per item: the count after the increment (a string when it is too big for a Lua
-- double to carry exactly), or an error reply for that item alone.
local n = tonumber(ARGV[1])
local deadline = ARGV[2]
local m = #KEYS - n
local each = #ARGV == 2 + n + m  -- one amount per item
local a = each and 2 + n or 3
local pcall = redis.pcall
-- Holds a key to the deadline: sets it when the key has no expiry (PERSIST, a foreign SET)
-- or a later one (a foreign PEXPIRE), so no key outlives its window + grace. PEXPIREAT LT
-- is that check and repair in one command (Redis >= 7.0); an older server refuses LT and
-- gets the missing-TTL repair only.
local function hold(key)
  if type(pcall('PEXPIREAT', key, deadline, 'LT')) == 'table' and redis.call('PTTL', key) == -1 then
    redis.call('PEXPIREAT', key, deadline)
  end
end
local rid = {}
for j = 1, m do rid[tonumber(ARGV[a + j])] = KEYS[n + j] end
local out = {}
local amount = ARGV[3]
for i = 1, n do
  local key = KEYS[i]
  if each then amount = ARGV[2 + i] end
  local r = rid[i]
  local v
  if r and not redis.call('SET', r, '1', 'NX', 'PXAT', deadline) then
    -- A repeat of a request id in this window: count nothing, still repair the TTLs of the
    -- id and of the count.
    hold(r)
    hold(key)
    v = pcall('GET', key) or '0'
  else
    v = pcall('INCRBY', key, amount)
    if type(v) == 'table' then
      if r then redis.call('DEL', r) end  -- not counted, so the id is not used up
      hold(key)  -- a foreign value: the error stands, and the key still ends with its window
    else
      -- First increment of the window (no TTL yet), or a TTL lost to PERSIST, a foreign SET
      -- or a replica promotion, or stretched by a foreign PEXPIRE: the key gets its deadline.
      -- This is hold(key) written out: every increment takes this path.
      if type(pcall('PEXPIREAT', key, deadline, 'LT')) == 'table' and redis.call('PTTL', key) == -1 then
        redis.call('PEXPIREAT', key, deadline)
      end
      if v >= 9007199254740992 then v = redis.call('GET', key) end
    end
  end
  out[i] = v
end
return out
