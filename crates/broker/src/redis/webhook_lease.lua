-- Takes or renews a node's lease on reading a webhook queue.
-- KEYS[1] the lease key. ARGV[1] the node id, ARGV[2] the lease in ms.
-- Returns 1 when the node holds the lease now, 0 when another node does.
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
