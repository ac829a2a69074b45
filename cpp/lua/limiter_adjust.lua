-- Refunds, reservations and settlements of a rate limiter's state, for every rate strategy.
-- KEYS[1..n]: limit i's state key (as the strategy's hit script names it); KEYS[n + 1],
-- when given: the request id's record (a refund's marker, or a reservation).
-- ARGV[1] = now (ms; µs for gcra), or '' to read the server's TIME; ARGV[2] = the strategy:
-- 'fw', 'sw', 'swa', 'tb' or 'gcra'; ARGV[3] = the operation; ARGV[4] = units (a refund's
-- cost, a reservation's estimate, a settlement's actual use); ARGV[5] = the record's TTL in
-- ms; ARGV[6] = a unique id (members of sliding-log charges); ARGV[7] = a refund's charge
-- time (the hit's `now`, in the script's unit), or '' when the caller does not know where
-- it charged; then per limit i four numbers ARGV[4 + 4i .. 7 + 4i]:
--   fw    amount, the window's expire-at (ms), the charged window's expire-at (ms; 0 when
--         ARGV[7] is ''), 0
--   sw    amount, window (ms)                    swa   amount, sub-bucket (ms), sub-buckets
--   tb    amount, window (ms), capacity           gcra  emission interval (µs), burst
-- Where a charge was made (its mark, per limit: the window's expire-at for fw, the charge
-- time for the others) decides what a refund or a settlement may credit: only the state
-- that still holds the charge, so that a refund never admits past a limit.
--   fw    the charged window, while it is the key's current one (nothing once it ended)
--   sw    the charge's own entries (score = the charge time) that are still in the log
--   swa   the charge's own sub-bucket, while it still weighs in
--   tb    what has not refilled since the charge: cost - elapsed * rate, floor 0, up to
--         the capacity
--   gcra  the same: the arrival time moves back by at most cost * interval - elapsed
-- Without a mark (a refund without a charge time, a record written before marks were
-- kept) the current state is credited as before: fw's current window, sw's newest entries,
-- swa's newest sub-buckets, the buckets' full cost.
-- Operations:
--   refund   gives back up to `units` on every limit; with a record: a no-op when the
--            record exists (duplicate), else the record is written with the refund (its
--            value: where the refunded units were charged, ARGV[7], or '1' when unknown).
--   reserve  charges the estimate when every limit allows it (as a hit would), and writes
--            the record '<estimate>@<mark 1>,<mark 2>,...' (TTL = the deadline) with the
--            charge; a record that exists makes it a duplicate that charges nothing.
--   settle   with a pending record: gives back estimate - actual where the reservation
--            charged (see above), or charges actual - estimate unconditionally (the units
--            were used), and marks the record settled, 's<estimate>' (keeping its TTL); a
--            settled record: duplicate; no record: expired (nothing happens: the estimate
--            stands).
-- Reply: {now, status, units, estimate}: status 1 applied, 2 duplicate, 0 refused, 3 no
-- reservation; units = refund: the fewest given back over the limits, reserve: the
-- estimate charged, settle: > 0 the fewest given back over the limits, < 0 charged
-- (actual - estimate).
local kind, op = ARGV[2], ARGV[3]
local now = tonumber(ARGV[1])
if not now then
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  if kind == 'gcra' then
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  else
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
end
local units = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local uid = ARGV[6]
local charged_at = tonumber(ARGV[7])
local n = (#ARGV - 7) / 4
local record = KEYS[n + 1]
local function arg(i, j) return tonumber(ARGV[7 + 4 * (i - 1) + j]) end
local function fmt(x) return string.format('%d', x) end

-- Per strategy: give(i, c, mark, charged) gives back up to c of a charge of `charged` made
-- at `mark` (nil: unknown, the current state) and returns what it gave; allows(i, c) tells
-- whether a hit of c would be allowed; charge(i, c) charges c whatever the state; mark(i)
-- is where a charge made now is (see the head of this file).
local give, allows, charge, mark

if kind == 'fw' then
  local function count(i)
    local c = tonumber(redis.pcall('GET', KEYS[i]) or '0')
    if c == nil then return 0 end
    return c
  end
  give = function(i, c, m)
    if m and m ~= arg(i, 2) then return 0 end  -- that window has ended
    local have = count(i)
    if have <= 0 then return 0 end
    local g = math.min(have, c)
    redis.call('DECRBY', KEYS[i], g)
    return g
  end
  allows = function(i, c) return count(i) + c <= arg(i, 1) end
  mark = function(i) return arg(i, 2) end
  charge = function(i, c)
    if tonumber(redis.pcall('GET', KEYS[i]) or '0') == nil then
      redis.call('DEL', KEYS[i])  -- a foreign value is garbage: start the window afresh
    end
    redis.call('INCRBY', KEYS[i], c)
    -- Held to the window's end, as fixed_window_hit.lua holds it (LT needs Redis 7.0).
    local at = arg(i, 2)
    if type(redis.pcall('PEXPIREAT', KEYS[i], at, 'LT')) == 'table' and redis.call('PTTL', KEYS[i]) == -1 then
      redis.call('PEXPIREAT', KEYS[i], at)
    end
  end
elseif kind == 'sw' then
  -- The hits in the window (those older are dropped, as a hit drops them).
  local function trim(i)
    if type(redis.pcall('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - arg(i, 2))) == 'table' then
      redis.call('DEL', KEYS[i])
    end
    return redis.call('ZCARD', KEYS[i])
  end
  give = function(i, c, m, charged)
    if not m then
      local g = math.min(trim(i), c)
      if g > 0 then redis.call('ZREMRANGEBYRANK', KEYS[i], -g, -1) end  -- the newest entries
      return g
    end
    trim(i)
    -- The charge put min(charged, amount) entries at its time; what is kept of it
    -- (charged - c) keeps as many of them. Entries of one time are alike, whoever made them.
    local own = math.min(charged, arg(i, 1))
    local g = own - math.min(charged - c, own)
    if g <= 0 then return 0 end
    local mine = redis.call('ZRANGEBYSCORE', KEYS[i], fmt(m), fmt(m), 'LIMIT', 0, g)
    for x = 1, #mine do redis.call('ZREM', KEYS[i], mine[x]) end
    return #mine
  end
  allows = function(i, c) return trim(i) + c <= arg(i, 1) end
  mark = function() return now end
  charge = function(i, c)
    trim(i)
    -- More than `amount` entries only keep the window full for as long as `amount` do.
    local m = math.min(c, arg(i, 1))
    local stamp = fmt(now) .. ':' .. uid .. ':'
    local j = 1
    while j <= m do
      local args = {}
      for x = j, math.min(m, j + 255) do
        args[#args + 1] = now
        args[#args + 1] = stamp .. x
      end
      redis.call('ZADD', KEYS[i], unpack(args))
      j = j + 256
    end
    -- Until the newest entry leaves the window (a lease's, stamped ahead, may be newer).
    local last = redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')
    local keep = arg(i, 2)
    if last[2] then keep = math.max(keep, tonumber(last[2]) - now + keep) end
    redis.call('PEXPIRE', KEYS[i], keep)
  end
elseif kind == 'swa' then
  local function field(i, idx)
    local v = redis.pcall('HGET', KEYS[i], fmt(idx))
    if type(v) == 'table' then
      redis.call('DEL', KEYS[i])
      return 0
    end
    return tonumber(v or '0') or 0
  end
  give = function(i, c, m)
    local bucket, k = arg(i, 2), arg(i, 3)
    local cur = math.floor(now / bucket)
    if m then
      local idx = math.floor(m / bucket)
      if idx < cur - k or idx > cur then return 0 end  -- no longer weighs in
      local g = math.min(field(i, idx), c)
      if g <= 0 then return 0 end
      if redis.call('HINCRBY', KEYS[i], fmt(idx), -g) <= 0 then redis.call('HDEL', KEYS[i], fmt(idx)) end
      return g
    end
    local left = c
    -- The newest sub-buckets first, back to the oldest that still weighs in.
    for idx = cur, cur - k, -1 do
      if left == 0 then break end
      local have = field(i, idx)
      if have > 0 then
        local g = math.min(have, left)
        if redis.call('HINCRBY', KEYS[i], fmt(idx), -g) <= 0 then redis.call('HDEL', KEYS[i], fmt(idx)) end
        left = left - g
      end
    end
    return c - left
  end
  allows = function(i, c)
    local amount, bucket, k = arg(i, 1), arg(i, 2), arg(i, 3)
    local cur = math.floor(now / bucket)
    local scaled = field(i, cur - k) * (bucket - (now - cur * bucket))
    for idx = cur - k + 1, cur do scaled = scaled + field(i, idx) * bucket end
    return scaled + c * bucket <= amount * bucket
  end
  mark = function() return now end
  charge = function(i, c)
    local bucket, k = arg(i, 2), arg(i, 3)
    local cur = math.floor(now / bucket)
    field(i, cur)
    redis.call('HINCRBY', KEYS[i], fmt(cur), c)
    redis.call('PEXPIRE', KEYS[i], (cur + k + 1) * bucket - now)
  end
elseif kind == 'tb' then
  -- The level now, in units of 1/window token (as token_bucket.lua computes it).
  local function level(i)
    local amount, window, cap = arg(i, 1), arg(i, 2), arg(i, 3)
    local full = cap * window
    local v = redis.pcall('HMGET', KEYS[i], 'tokens', 'ts', 'cap')
    if v.err then
      redis.call('DEL', KEYS[i])
      return full
    end
    local tokens, ts, was = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
    if not tokens or not ts or tokens < 0 then return full end
    if was and was ~= full then
      tokens = tokens + full - was
      if tokens < 0 then tokens = 0 end
    end
    if tokens > full then tokens = full end
    if now > ts then
      if now - ts >= math.ceil((full - tokens) / amount) then return full end
      tokens = tokens + (now - ts) * amount
    end
    if tokens > full then tokens = full end
    return tokens
  end
  local function store(i, lv)
    local amount, window, cap = arg(i, 1), arg(i, 2), arg(i, 3)
    local full = cap * window
    if lv >= full then
      redis.call('DEL', KEYS[i])  -- a full bucket is an absent key
      return
    end
    redis.call('HSET', KEYS[i], 'tokens', fmt(lv), 'ts', fmt(now), 'cap', fmt(full))
    redis.call('PEXPIRE', KEYS[i], math.max(1, math.ceil((full - lv) / amount)))
  end
  give = function(i, c, m, charged)
    local amount, window, full = arg(i, 1), arg(i, 2), arg(i, 3) * arg(i, 2)
    local back = c * window
    if m then
      -- What has not refilled since the charge (units of 1/window token).
      back = math.min(back, math.max(0, charged * window - math.max(0, now - m) * amount))
    end
    local lv = level(i)
    local after = math.min(full, lv + back)
    store(i, after)
    return math.ceil((after - lv) / window)  -- a token partly refilled counts as given
  end
  allows = function(i, c) return level(i) >= c * arg(i, 2) end
  mark = function() return now end
  -- A negative level would read as a full bucket: the debt stops at empty.
  charge = function(i, c) store(i, math.max(0, level(i) - c * arg(i, 2))) end
else  -- gcra
  local function tat(i)
    local t = tonumber(redis.pcall('GET', KEYS[i]) or '0')
    if t == nil then
      redis.call('DEL', KEYS[i])
      t = 0
    end
    if t < now then t = now end
    return t
  end
  local function store(i, t)
    if t <= now then
      redis.call('DEL', KEYS[i])
    else
      redis.call('SET', KEYS[i], fmt(t), 'PX', math.ceil((t - now) / 1000))
    end
  end
  give = function(i, c, m, charged)
    local interval = arg(i, 1)
    local back = c * interval
    if m then back = math.min(back, math.max(0, charged * interval - math.max(0, now - m))) end
    local t = tat(i)
    local after = math.max(now, t - back)
    store(i, after)
    return math.ceil((t - after) / interval)
  end
  allows = function(i, c) return tat(i) + c * arg(i, 1) - now <= arg(i, 2) * arg(i, 1) end
  mark = function() return now end
  charge = function(i, c) store(i, tat(i) + c * arg(i, 1)) end
end

local function held()
  if not record then return nil end
  local v = redis.pcall('GET', record)
  if type(v) == 'table' then
    redis.call('DEL', record)  -- not ours: no record
    return nil
  end
  if v == false then return nil end
  return v
end

-- A pending reservation's record: its estimate and, per limit, where it charged.
local function pending(h)
  local est, marks = string.match(h, '^(%d+)@(.*)$')
  if not est then return tonumber(h) or 0, {} end  -- written before marks were kept
  local ms = {}
  for x in string.gmatch(marks, '[^,]+') do ms[#ms + 1] = tonumber(x) end
  return tonumber(est), ms
end

if op == 'refund' then
  if held() then return {now, 2, 0, 0} end
  local least = units
  for i = 1, n do
    local m = charged_at
    if m and kind == 'fw' then m = arg(i, 3) end
    least = math.min(least, give(i, units, m, units))
  end
  if record then redis.call('SET', record, charged_at and ARGV[7] or '1', 'PX', ttl) end
  return {now, 1, least, 0}
elseif op == 'reserve' then
  local h = held()
  if h then return {now, 2, 0, tonumber(string.match(h, '^s?(%d+)')) or 0} end
  for i = 1, n do
    if not allows(i, units) then return {now, 0, 0, units} end
  end
  local marks = {}
  for i = 1, n do
    charge(i, units)
    marks[i] = fmt(mark(i))
  end
  redis.call('SET', record, fmt(units) .. '@' .. table.concat(marks, ','), 'PX', ttl)
  return {now, 1, units, units}
else  -- settle
  local h = held()
  if not h then return {now, 3, 0, 0} end
  if string.sub(h, 1, 1) == 's' then return {now, 2, 0, tonumber(string.sub(h, 2)) or 0} end
  local estimate, marks = pending(h)
  local delta = estimate - units
  local moved = delta
  for i = 1, n do
    if delta > 0 then
      moved = math.min(moved, give(i, delta, marks[i], estimate))
    elseif delta < 0 then
      charge(i, -delta)
    end
  end
  redis.call('SET', record, 's' .. fmt(estimate), 'KEEPTTL')
  return {now, 1, moved, estimate}
end
