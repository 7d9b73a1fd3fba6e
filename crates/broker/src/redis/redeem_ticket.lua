-- Redeems a single-use ticket, with the checks in the order of core's TicketBook.
-- KEYS[1] ticket hash (grant, exp, used).
-- ARGV[1] now, Unix milliseconds.
-- Returns {'ok', grant} or {'invalid', ''}, {'expired', ''}, {'used', ''}.
local t = redis.call('HMGET', KEYS[1], 'grant', 'exp', 'used')
if not t[1] then
  return {'invalid', ''}
end
if tonumber(ARGV[1]) >= tonumber(t[2]) then
  return {'expired', ''}
end
if t[3] == '1' then
  return {'used', ''}
end
-- HSET keeps the key's TTL, so a used ticket is still told apart until it goes.
redis.call('HSET', KEYS[1], 'used', '1')
return {'ok', t[1]}
