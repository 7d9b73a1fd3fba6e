-- Appends entries to a room's log and, unless told to wait, publishes them,
-- in one atomic step: a node's entries for one room in one round trip go in
-- one call, so that on a Redis Cluster a call redirected elsewhere (MOVED,
-- ASK, TRYAGAIN) has run none of them and can be made again whole.
-- KEYS[1] the room's meta hash, KEYS[2] the room's log stream.
-- ARGV[1] log capacity, ARGV[2] the room's pub/sub channel, ARGV[3] '1' to
-- publish now (broker_ack primary), '0' to leave that to publish.lua once
-- WAIT confirmed the entries' replicas (broker_ack replicas:N), ARGV[4] the
-- publishing command (PUBLISH, or SPUBLISH on a Redis Cluster), ARGV[5..]
-- the payloads, in order.
-- Returns {n, ts}: the first entry's log position (the others follow it one
-- by one) and their timestamp; or nil when the room does not exist.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
local count = #ARGV - 4
local n = redis.call('HINCRBY', KEYS[1], 'n', count) - count + 1
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
local publish = ARGV[3] == '1'
for i = 1, count do
  local at = n + i - 1
  -- An explicit id <n>-0 makes a read by log position an exact XRANGE.
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], string.format('%d', at) .. '-0',
    'ts', ts_text, 'p', ARGV[4 + i])
  if publish then
    redis.call(ARGV[4], ARGV[2], struct.pack('>I8>I8', at, ts) .. ARGV[4 + i])
  end
end
-- 'r' is the last entry log reads may return (absent: all of them). It
-- exists once a node waited for replicas in this room; appends that do not
-- wait keep it at the end, so nodes of either setting see the same log.
local last_n = string.format('%d', n + count - 1)
if publish then
  if redis.call('HEXISTS', KEYS[1], 'r') == 1 then
    redis.call('HSET', KEYS[1], 'r', last_n)
  end
elseif redis.call('HEXISTS', KEYS[1], 'r') == 0 then
  redis.call('HSET', KEYS[1], 'r', string.format('%d', n - 1))
end
return {n, ts}
