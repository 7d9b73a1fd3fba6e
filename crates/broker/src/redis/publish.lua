-- Publishes a room's entry once WAIT confirmed that enough replicas have it
-- (broker_ack replicas:N), and lets log reads return it.
-- KEYS[1] the room's meta hash, KEYS[2] the room's log stream.
-- ARGV[1] the room's pub/sub channel, ARGV[2] the entry's log position n.
-- Returns 1 when published, 0 when the room or the entry is gone.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local n = tonumber(ARGV[2])
-- Never backwards: another node's later entry may have been confirmed first
-- (its WAIT covered this one too, which was written before it).
if n > tonumber(redis.call('HGET', KEYS[1], 'r') or '0') then
  redis.call('HSET', KEYS[1], 'r', ARGV[2])
end
local id = ARGV[2] .. '-0'
local found = redis.call('XRANGE', KEYS[2], id, id)
if #found == 0 then
  return 0
end
local fields = found[1][2]
local ts, payload
for i = 1, #fields, 2 do
  if fields[i] == 'ts' then
    ts = tonumber(fields[i + 1])
  elseif fields[i] == 'p' then
    payload = fields[i + 1]
  end
end
redis.call('PUBLISH', ARGV[1], struct.pack('>I8>I8', n, ts) .. payload)
return 1
