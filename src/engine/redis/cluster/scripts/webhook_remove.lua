-- webhook_remove: drop a webhook registration.
-- KEYS: 1 the topic's webhook set, 2 this shard's registration counter. ARGV: 1 url.
-- Returns 1 removed, 0 it was not registered.
if redis.call('SREM', KEYS[1], ARGV[1]) == 1 then
  if redis.call('DECR', KEYS[2]) < 0 then redis.call('SET', KEYS[2], '0') end
  return 1
end
return 0
