-- mailbox: the topics a client id keeps a subscription of, for the whole cluster
-- (`--max-mailbox-topics`), in a sorted set on the client's own slot (`{client}`): member
-- the topic, score when its mailbox would expire without a socket (refreshed by every
-- subscription and socket close; a member past its score no longer counts).
-- KEYS: 1 the client's set. ARGV: 1 op (add: refused past the limit, touch: only a member's
--   score, del), 2 topic, 3 the limit, 4 mailbox ttl ms.
-- Returns 1, or when an add was refused the topics the client keeps (so that the node
-- refusing it can tell the client's further subscriptions apart: kept, or one more).
local K, op, topic = KEYS[1], ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', K, '-inf', string.format('%d', now))
if op == 'del' then
  redis.call('ZREM', K, topic)
  return 1
end
local exp = string.format('%d', now + tonumber(ARGV[4]))
if op == 'touch' then
  redis.call('ZADD', K, 'XX', exp, topic)
elseif redis.call('ZSCORE', K, topic) or redis.call('ZCARD', K) < tonumber(ARGV[3]) then
  redis.call('ZADD', K, exp, topic)
else
  return redis.call('ZRANGE', K, 0, -1)
end
redis.call('PEXPIRE', K, tonumber(ARGV[4]))
return 1
