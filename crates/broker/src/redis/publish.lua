-- Publishes a room's entries once WAIT confirmed that enough replicas have
-- them (broker_ack replicas:N), and lets log reads return them.
-- KEYS[1] the room's meta hash, KEYS[2] the room's log stream.
-- ARGV[1] the room's pub/sub channel, ARGV[2] the publishing command
-- (PUBLISH, or SPUBLISH on a Redis Cluster), ARGV[3] and ARGV[4] the first
-- and last log positions.
-- Returns how many were published (0 when the room or the entries are gone).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
-- Never backwards: another node's later entry may have been confirmed first
-- (its WAIT covered these too, which were written before it).
if tonumber(ARGV[4]) > tonumber(redis.call('HGET', KEYS[1], 'r') or '0') then
  redis.call('HSET', KEYS[1], 'r', ARGV[4])
end
local found = redis.call('XRANGE', KEYS[2], ARGV[3] .. '-0', ARGV[4] .. '-0')
for _, entry in ipairs(found) do
  local n = tonumber(string.match(entry[1], '^(%d+)'))
  local fields = entry[2]
  local ts, payload
  for i = 1, #fields, 2 do
    if fields[i] == 'ts' then
      ts = tonumber(fields[i + 1])
    elseif fields[i] == 'p' then
      payload = fields[i + 1]
    end
  end
  redis.call(ARGV[2], ARGV[1], struct.pack('>I8>I8', n, ts) .. payload)
end
return #found
