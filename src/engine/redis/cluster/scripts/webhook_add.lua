-- webhook_add: register a webhook url for a topic, once.
-- KEYS: 1 the topic's webhook set, 2 this shard's registration counter.
-- ARGV: 1 url, 2 max per topic, 3 max on this shard.
-- Returns 1 added, 0 already registered, -1 the topic is full, -2 the shard is full.
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 0 end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then return -1 end
if tonumber(redis.call('GET', KEYS[2]) or '0') >= tonumber(ARGV[3]) then return -2 end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('INCR', KEYS[2])
return 1
