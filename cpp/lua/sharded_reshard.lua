-- A sharded counter's layout change (reshard), compare-and-set: the layout key must still
-- hold what the caller read, so of two concurrent reshards exactly one wins and the other
-- is told, never a layout that mixes both.
-- KEYS[1] = the counter's layout key (a string; absent = the counter's first generation)
-- ARGV[1] = the layout text the caller read ('' = absent), ARGV[2] = the new layout text
-- Reply: {1, new text} when set, {0, current text} when the layout had changed.
local cur = redis.call('GET', KEYS[1]) or ''
if cur ~= ARGV[1] then return {0, cur} end
redis.call('SET', KEYS[1], ARGV[2])
return {1, ARGV[2]}
