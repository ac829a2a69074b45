-- Idempotent increments of sharded counters: per item, record the request id, add the amount
-- to the shard and append the delta to the shard's log, all or nothing.
-- ARGV[1] = n items, ARGV[2] = request-id lifetime (ms), ARGV[3] = log MAXLEN (approximate)
-- ARGV[4 + 5(i-1) ..] = amount, counter name, shard, request id ('' = none), reason ('' = none:
-- an audited adjustment carries one, and only then is a 'reason' field added to its log entry)
-- of item i
-- KEYS, per item in order: the shard's value key, its log key, then its request-id key
-- when the item has a request id.
-- Reply, per item: 1 applied, 0 already applied (a repeat of its request id), or an error
-- reply for that item alone (then nothing of it is stored and its id is not used up).
local n = tonumber(ARGV[1])
local ttl = ARGV[2]
local maxlen = ARGV[3]
local out = {}
local k = 1
for i = 1, n do
  local a = 4 + 5 * (i - 1)
  local amount, name, shard, rid, reason = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local value, log = KEYS[k], KEYS[k + 1]
  local ridkey = nil
  k = k + 2
  if rid ~= '' then
    ridkey = KEYS[k]
    k = k + 1
  end
  if ridkey and not redis.call('SET', ridkey, '1', 'NX', 'PX', ttl) then
    out[i] = 0
  else
    local v = redis.pcall('INCRBY', value, amount)
    if type(v) == 'table' then
      if ridkey then redis.call('DEL', ridkey) end
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
        if ridkey then redis.call('DEL', ridkey) end
        out[i] = id
      else
        out[i] = 1
      end
    end
  end
end
return out
