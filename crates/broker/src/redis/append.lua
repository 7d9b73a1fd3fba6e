-- Appends one entry to a room's log and, unless told to wait, publishes it,
-- in one atomic step.
-- KEYS[1] the room's meta hash, KEYS[2] the room's log stream.
-- ARGV[1] log capacity, ARGV[2] the room's pub/sub channel, ARGV[3] payload,
-- ARGV[4] '1' to publish now (broker_ack primary), '0' to leave that to
-- publish.lua once WAIT confirmed the entry's replicas (broker_ack replicas:N).
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
local n_text = string.format('%d', n)
redis.call('HSET', KEYS[1], 'ts', ts_text)
-- An explicit id <n>-0 makes a read by log position an exact XRANGE.
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], n_text .. '-0',
  'ts', ts_text, 'p', ARGV[3])
-- 'r' is the last entry log reads may return (absent: all of them). It
-- exists once a node waited for replicas in this room; appends that do not
-- wait keep it at the end, so nodes of either setting see the same log.
if ARGV[4] == '1' then
  if redis.call('HEXISTS', KEYS[1], 'r') == 1 then
    redis.call('HSET', KEYS[1], 'r', n_text)
  end
  redis.call('PUBLISH', ARGV[2], struct.pack('>I8>I8', n, ts) .. ARGV[3])
elseif redis.call('HEXISTS', KEYS[1], 'r') == 0 then
  redis.call('HSET', KEYS[1], 'r', string.format('%d', n - 1))
end
return {n, ts}
