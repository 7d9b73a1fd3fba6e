-- On a Redis Cluster: enqueues a room's records for one webhook target past
-- that target's cursor for the room, then moves the cursor. The room's own
-- cursor ('wh' in its meta hash) lives in another slot and is moved after
-- every target took its records (webhook_mark.lua); replaying from it after
-- a crash in between lands nothing twice, thanks to this cursor.
-- KEYS[1] the target's stream, KEYS[2] the target's cursors (a hash: room id
-- to log position).
-- ARGV[1] upto (the last log position applied), ARGV[2] the room id,
-- ARGV[3] '1' if the room exists, ARGV[4] the record count, then 5 arguments
-- per record: position (0: no cursor), max length, event id, body, Unix ms.
-- Returns how many records were dropped at the queue's max length.
local exists = ARGV[3] == '1'
local cursor = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
local dropped = 0
local i = 5
for _ = 1, tonumber(ARGV[4]) do
  local position = tonumber(ARGV[i])
  if position == 0 or (exists and position > cursor) then
    if redis.call('XLEN', KEYS[1]) < tonumber(ARGV[i + 1]) then
      redis.call('XADD', KEYS[1], '*', 'r', ARGV[2], 'i', ARGV[i + 2], 'b', ARGV[i + 3], 't', ARGV[i + 4])
    else
      dropped = dropped + 1
    end
  end
  i = i + 5
end
local upto = tonumber(ARGV[1])
if exists and upto > cursor then
  redis.call('HSET', KEYS[2], ARGV[2], string.format('%d', upto))
end
return dropped
