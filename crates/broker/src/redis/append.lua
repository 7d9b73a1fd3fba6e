-- Appends one entry to a room's log and publishes it, in one atomic step.
-- KEYS[1] the room's meta hash, KEYS[2] the room's log stream.
-- ARGV[1] log capacity, ARGV[2] the room's pub/sub channel, ARGV[3] payload.
-- Returns {n, ts}, or nil when the room does not exist.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
local n = redis.call('HINCRBY', KEYS[1], 'n', 1)
local now = redis.call('TIME')
local ts = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
-- Replicas apply entries at their timestamps, so time must not run backwards
-- within a room even when the server's clock is set back.
local last = tonumber(redis.call('HGET', KEYS[1], 'ts') or '0')
if ts < last then
  ts = last
end
-- string.format, not concatenation: Lua prints large numbers in exponent form.
local ts_text = string.format('%d', ts)
redis.call('HSET', KEYS[1], 'ts', ts_text)
-- An explicit id <n>-0 makes a read by log position an exact XRANGE.
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], string.format('%d-0', n),
  'ts', ts_text, 'p', ARGV[3])
redis.call('PUBLISH', ARGV[2], struct.pack('>I8>I8', n, ts) .. ARGV[3])
return {n, ts}
