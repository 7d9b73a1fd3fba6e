-- On a Redis Cluster: moves a room's webhook cursor once every target took
-- its records (webhook_enqueue_target.lua). Never backwards.
-- KEYS[1] the room's meta hash. ARGV[1] upto.
-- Returns 1 when moved, 0 when not (no room, or already there).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local upto = tonumber(ARGV[1])
if upto <= tonumber(redis.call('HGET', KEYS[1], 'wh') or '0') then
  return 0
end
redis.call('HSET', KEYS[1], 'wh', string.format('%d', upto))
return 1
