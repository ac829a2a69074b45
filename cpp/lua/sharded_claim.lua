-- The claim step of a sharded write with a request id, for the older generations' shards
-- that live in another hash slot than the write's own shard (Redis Cluster, a ring): there
-- the id's keys of all generations cannot be checked and recorded in one script, so the
-- writer first claims the id in each older shard, then writes its own shard
-- (sharded_incr.lua).
-- KEYS = the id's key in older generations' shards, all in one hash slot (one call per slot)
-- ARGV[1] = request-id lifetime (ms)
-- Reply, per key: 1 when the id was applied there (any value but the claim marker: the
-- write is a duplicate), 0 when it was not, and the key now holds the claim marker 'n'
-- until the id's lifetime ends. A writer still on the layout in which that shard is
-- current meets the marker in sharded_incr.lua, which answers -1 instead of applying:
-- it reads the layout again and writes where the claiming writer writes. So an id is
-- counted once whichever writer and layout get there first, and a claim whose write never
-- came (a crash between the two steps) is harmless: the retry claims again and writes.
local call = redis.call
local ttl = tonumber(ARGV[1])
if #ARGV ~= 1 or not ttl or ttl < 1 then return redis.error_reply('ERR sharded_claim: malformed arguments') end
local now = call('TIME')
local at = string.format('%.0f', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + ttl)
local out = {}
for i = 1, #KEYS do
  local v = call('GET', KEYS[i])
  if v and v ~= 'n' then
    out[i] = 1
  else
    call('SET', KEYS[i], 'n', 'PXAT', at)
    out[i] = 0
  end
end
return out
