-- Idempotent increments of sharded counters: per item, record the request id, add the amount
-- to the shard and append the delta to the shard's log, all or nothing.
-- ARGV[1] = n items, ARGV[2] = request-id lifetime (ms), ARGV[3] = log MAXLEN (approximate)
-- ARGV[4 + 6(i-1) ..] = amount, counter name, shard, request id ('' = none), reason ('' = none:
-- an audited adjustment carries one, and only then is a 'reason' field added to its log entry),
-- and the number of extra request-id keys (0 without a request id) of item i
-- KEYS, per item in order: the shard's value key, its log key, then, when the item has a
-- request id, its request-id key followed by the extra request-id keys: the same id in the
-- shards that older shard generations route it to (for idempotency_ttl after a reshard, so a
-- retry is recognised whichever generation its first attempt went to). The id counts as
-- seen when any of them holds it; a new id is recorded in all of them.
-- Reply, per item: 1 applied, 0 already applied (a repeat of its request id), or an error
-- reply for that item alone (then nothing of it is stored and its id is not used up).
local n = tonumber(ARGV[1])
local ttl = ARGV[2]
local maxlen = ARGV[3]
local out = {}
local k = 1
local function forget(ids)
  for j = 1, #ids do redis.call('DEL', ids[j]) end
end
for i = 1, n do
  local a = 4 + 6 * (i - 1)
  local amount, name, shard, rid, reason = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local extra = tonumber(ARGV[a + 5])
  local value, log = KEYS[k], KEYS[k + 1]
  local ids = {}
  k = k + 2
  if rid ~= '' then
    for j = 0, extra do ids[#ids + 1] = KEYS[k + j] end
    k = k + 1 + extra
  end
  local seen = false
  if #ids > 0 then
    if not redis.call('SET', ids[1], '1', 'NX', 'PX', ttl) then
      seen = true
    else
      for j = 2, #ids do
        if redis.call('EXISTS', ids[j]) == 1 then seen = true end
      end
      if seen then
        redis.call('DEL', ids[1])
      else
        for j = 2, #ids do redis.call('SET', ids[j], '1', 'PX', ttl) end
      end
    end
  end
  if seen then
    out[i] = 0
  else
    local v = redis.pcall('INCRBY', value, amount)
    if type(v) == 'table' then
      forget(ids)
      out[i] = v
    else
      local id
      if reason == '' then
        id = redis.pcall('XADD', log, 'MAXLEN', '~', maxlen, '*', 'counter', name, 'shard', shard,
                         'delta', amount, 'request_id', rid)
      else
        id = redis.pcall('XADD', log, 'MAXLEN', '~', maxlen, '*', 'counter', name, 'shard', shard,
                         'delta', amount, 'request_id', rid, 'reason', reason)
      end
      if type(id) == 'table' then
        -- The log refused the entry (a key of another type): take the increment back so the
        -- value never holds a delta its log does not.
        redis.call('DECRBY', value, amount)
        forget(ids)
        out[i] = id
      else
        out[i] = 1
      end
    end
  end
end
return out
