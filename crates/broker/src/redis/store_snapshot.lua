-- Stores a snapshot unless one at the same or a later position is stored.
-- KEYS[1] meta hash, KEYS[2] snapshot hash.
-- ARGV[1] log position, ARGV[2] snapshot bytes.
-- Returns 1 when stored, 0 when an as new snapshot was there, -1 when there is no room.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
local stored = redis.call('HGET', KEYS[2], 'n')
if stored and tonumber(stored) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[2], 'n', ARGV[1], 'data', ARGV[2])
return 1
