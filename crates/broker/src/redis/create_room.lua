-- Adds a room to the registry unless the id is taken.
-- KEYS[1] meta hash, KEYS[2] log stream, KEYS[3] snapshot hash, KEYS[4] room set (absent
-- on a Redis Cluster, where the node updates the registry in a second step).
-- ARGV[1] room id, ARGV[2] meta, ARGV[3] initial snapshot (at position 0),
-- ARGV[4] a token of this creation: run again with it (a call repeated after
-- a broken connection), the script answers as the first time.
-- Returns 1 when created, 0 when the id is taken.
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HGET', KEYS[1], 'c') == ARGV[4] then
    return 1
  end
  return 0
end
-- Leftovers of an earlier room with this id must not leak into the new one.
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('HSET', KEYS[1], 'meta', ARGV[2], 'n', '0', 'ts', '0', 'c', ARGV[4])
redis.call('HSET', KEYS[3], 'n', '0', 'data', ARGV[3])
if KEYS[4] then
  redis.call('SADD', KEYS[4], ARGV[1])
end
return 1
