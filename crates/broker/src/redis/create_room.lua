-- Adds a room to the registry unless the id is taken.
-- KEYS[1] meta hash, KEYS[2] log stream, KEYS[3] snapshot hash, KEYS[4] room set (absent
-- on a Redis Cluster, where the node updates the registry in a second step).
-- ARGV[1] room id, ARGV[2] meta, ARGV[3] initial snapshot (at position 0).
-- Returns 1 when created, 0 when the id is taken.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
-- Leftovers of an earlier room with this id must not leak into the new one.
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('HSET', KEYS[1], 'meta', ARGV[2], 'n', '0', 'ts', '0')
redis.call('HSET', KEYS[3], 'n', '0', 'data', ARGV[3])
if KEYS[4] then
  redis.call('SADD', KEYS[4], ARGV[1])
end
return 1
