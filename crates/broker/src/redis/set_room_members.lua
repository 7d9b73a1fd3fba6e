-- Records a room's connected member count as of a log position, unless a count
-- for the same or a later position is recorded (writes from several nodes may
-- land out of order).
-- KEYS[1] meta hash. ARGV[1] count, ARGV[2] log position.
-- Returns 1 when recorded, 0 when a newer count was there, -1 when there is no room.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
local at = redis.call('HGET', KEYS[1], 'members_at')
if at and tonumber(at) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[1], 'members', ARGV[1], 'members_at', ARGV[2])
return 1
