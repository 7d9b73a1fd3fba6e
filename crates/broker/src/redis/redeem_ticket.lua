-- Redeems a single-use ticket, with the checks in the order of core's TicketBook.
-- KEYS[1] ticket hash (grant, exp, used: '0', or who redeemed it).
-- ARGV[1] now, Unix milliseconds. ARGV[2] a token of this redemption: run
-- again with it (a call repeated after a broken connection), the script
-- answers as the first time.
-- Returns {'ok', grant} or {'invalid', ''}, {'expired', ''}, {'used', ''}.
local t = redis.call('HMGET', KEYS[1], 'grant', 'exp', 'used')
if not t[1] then
  return {'invalid', ''}
end
if t[3] == ARGV[2] then
  return {'ok', t[1]}
end
if tonumber(ARGV[1]) >= tonumber(t[2]) then
  return {'expired', ''}
end
if t[3] ~= '0' then
  return {'used', ''}
end
-- HSET keeps the key's TTL, so a used ticket is still told apart until it goes.
redis.call('HSET', KEYS[1], 'used', ARGV[2])
return {'ok', t[1]}
