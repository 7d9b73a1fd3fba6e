-- Enqueues a room's webhook records past its cursor, then moves the cursor:
-- every replica of the room may enqueue the same entries; each lands once.
-- KEYS[1] the room's meta hash, KEYS[2..] the target streams.
-- ARGV[1] upto (the last log position applied), ARGV[2] the room id,
-- ARGV[3] the record count, then 6 arguments per record: position (0: no
-- cursor), stream index in KEYS, max length, event id, body, Unix ms.
-- Returns the stream indexes of the records dropped at their max length.
local exists = redis.call('EXISTS', KEYS[1]) == 1
local cursor = 0
if exists then
  cursor = tonumber(redis.call('HGET', KEYS[1], 'wh') or '0')
end
local dropped = {}
local i = 4
for _ = 1, tonumber(ARGV[3]) do
  local position = tonumber(ARGV[i])
  local k = tonumber(ARGV[i + 1])
  if position == 0 or (exists and position > cursor) then
    if redis.call('XLEN', KEYS[k]) < tonumber(ARGV[i + 2]) then
      redis.call('XADD', KEYS[k], '*', 'r', ARGV[2], 'i', ARGV[i + 3], 'b', ARGV[i + 4], 't', ARGV[i + 5])
    else
      dropped[#dropped + 1] = k
    end
  end
  i = i + 6
end
local upto = tonumber(ARGV[1])
if exists and upto > cursor then
  redis.call('HSET', KEYS[1], 'wh', string.format('%d', upto))
end
return dropped
