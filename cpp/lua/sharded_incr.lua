-- Idempotent increments of sharded counters: per item, record the request id, add the amount
-- to the shard and append the delta to the shard's log, all or nothing.
-- ARGV[1] = n items, ARGV[2] = request-id lifetime (ms), ARGV[3] = log MAXLEN (approximate),
-- ARGV[4] = w, the number of arguments per item, 2 or 4:
-- ARGV[5 + w(i-1) ..] = amount, request id ('' = none), and with w = 4 the number of extra
-- request-id keys (0 without a request id) and reason ('' = none: an audited adjustment carries
-- one, and only then is a 'reason' field added to its log entry) of item i. With w = 2 every
-- item has no extra keys and no reason (the common case, sent with half the arguments).
-- KEYS, per item in order: the shard's value key, its log key, then, when the item has a
-- request id, its request-id key followed by the extra request-id keys: the same id in the
-- shards that older shard generations route it to (for idempotency_ttl after a reshard, so a
-- retry is recognised whichever generation its first attempt went to). The id counts as
-- seen when any of them holds it; a new id is recorded in all of them. Only the older
-- shards in this call's hash slot are passed here; those in other slots (Redis Cluster, a
-- ring) are claimed first by sharded_claim.lua, which leaves the marker 'n'. An extra key
-- holding 'n' does not count as seen: the claiming writer writes a shard this call checks
-- or will check this call's shard, so whichever comes second sees the other.
-- The request-id key holding 'n' means a writer on a newer layout claimed the id in this
-- (retired) shard: the item answers -1, stores nothing, and the writer reads the layout
-- again and writes where that writer does.
-- A log entry is `delta <amount> request_id <id or ''>` [`reason <text>`]: its counter and shard
-- are the log's key and its time is the entry id, so they are not repeated in every entry.
-- Reply, per item: 1 applied, 0 already applied (a repeat of its request id), -1 claimed by
-- a writer on a newer layout (nothing stored: read the layout again), or an error reply for
-- that item alone (then nothing of it is stored and its id is not used up).
-- This runs once per write at the counters' full rate, so it is written for the interpreter:
-- locals for redis.call, one TIME for the whole call (ids expire at an absolute PXAT, which
-- Redis also propagates as is), and no table per item.
local call, try = redis.call, redis.pcall
local n = tonumber(ARGV[1])
local maxlen = ARGV[3]
local now = call('TIME')
local at = string.format('%.0f', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + tonumber(ARGV[2]))
local wide = ARGV[4] == '4'
local out = {}
local k, a = 1, 5
for i = 1, n do
  local amount, rid, extra, reason = ARGV[a], ARGV[a + 1], 0, ''
  if wide then
    extra, reason = tonumber(ARGV[a + 2]), ARGV[a + 3]
    a = a + 4
  else
    a = a + 2
  end
  local value, log, id, first = KEYS[k], KEYS[k + 1], nil, k + 2
  k = k + 2
  local seen = false
  if rid ~= '' then
    id = KEYS[k]
    k = k + 1 + extra  -- past this item's id keys, KEYS[first .. first + extra]
    if not call('SET', id, '1', 'NX', 'PXAT', at) then
      seen = try('GET', id) ~= 'n' or -1
    elseif extra > 0 then
      for j = 1, extra do
        local x = KEYS[first + j]
        if call('EXISTS', x) == 1 and try('GET', x) ~= 'n' then seen = true end
      end
      if seen then
        call('DEL', id)
      else
        for j = 1, extra do call('SET', KEYS[first + j], '1', 'PXAT', at) end
      end
    end
  end
  if seen == -1 then
    out[i] = -1
  elseif seen then
    out[i] = 0
  else
    -- INCR for the usual +1: one argument less to convert and parse than INCRBY, same errors.
    local v = amount == '1' and try('INCR', value) or try('INCRBY', value, amount)
    local err = type(v) == 'table' and v
    if not err then
      local e
      if reason == '' then
        e = try('XADD', log, 'MAXLEN', '~', maxlen, '*', 'delta', amount, 'request_id', rid)
      else
        e = try('XADD', log, 'MAXLEN', '~', maxlen, '*', 'delta', amount, 'request_id', rid, 'reason', reason)
      end
      if type(e) == 'table' then
        -- The log refused the entry (a key of another type): take the increment back so the
        -- value never holds a delta its log does not.
        call('DECRBY', value, amount)
        err = e
      end
    end
    if err then
      -- Nothing of this item stays stored, so its id is not used up either.
      if id then
        for j = first, first + extra do call('DEL', KEYS[j]) end
      end
      out[i] = err
    else
      out[i] = 1
    end
  end
end
return out
