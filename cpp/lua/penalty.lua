-- An escalating penalty: counts one refusal of a key and starts a block when it is the
-- `after`-th within `within` ms; a block that starts while the last one's record lives
-- (until `within` ms after it ended) is `factor` times as long, up to `max_ms`.
-- KEYS[1] = the block (expires when it ends), KEYS[2] = the refusals counted (expires
-- `within` after the first), KEYS[3] = the last block's length (expires `within` after it)
-- ARGV = after, within_ms, block_ms, factor (a decimal >= 1), max_ms
-- Reply: {ms, started}: the block in force (ms left; refusals during it do not count) or
-- the block this refusal started (started = 1); {0, 0} when none.
if #KEYS ~= 3 or #ARGV ~= 5 then return redis.error_reply('ERR penalty: malformed arguments') end
local after, within = tonumber(ARGV[1]), tonumber(ARGV[2])
local block, factor, max = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
-- Spans are whole ms up to 2^42 (about 139 years), so every sum below stays exact.
local function span(x) return x and x >= 1 and x <= 4398046511104 and math.floor(x) == x end
if not (after and span(within) and span(block) and factor and span(max)) or after < 1
    or factor < 1 or factor > 1000000 or max < block then
  return redis.error_reply('ERR penalty: malformed arguments')
end
-- Arguments are checked before the block is read, so a malformed call is refused the same
-- way whether or not a block is in force.
local left = redis.call('PTTL', KEYS[1])
if left > 0 then return {left, 0} end
redis.call('SET', KEYS[2], 0, 'PX', within, 'NX')
local n = redis.call('INCR', KEYS[2])
if n < after then return {0, 0} end
local len = block
local last = tonumber(redis.call('GET', KEYS[3]) or '')
-- A last length that is no length (a foreign value below 1 ms) starts again from `block`.
if last and last >= 1 then len = math.min(math.floor(last * factor), max) end
redis.call('SET', KEYS[1], len, 'PX', len)
redis.call('SET', KEYS[3], len, 'PX', len + within)
redis.call('DEL', KEYS[2])
return {len, 1}
