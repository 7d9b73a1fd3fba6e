-- Removes a room with its log and snapshot.
-- KEYS[1] meta hash, KEYS[2] log stream, KEYS[3] snapshot hash, KEYS[4] room set (absent
-- on a Redis Cluster, where the node updates the registry in a second step).
-- ARGV[1] room id.
-- Returns 1 when the room existed, else 0.
local existed = redis.call('EXISTS', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
if KEYS[4] then
  redis.call('SREM', KEYS[4], ARGV[1])
end
return existed
