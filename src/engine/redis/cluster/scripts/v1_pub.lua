-- v1_pub: a WalletConnect 1.0 `pub` (DECISIONS §8): live to the topic's v1 subscribers on
-- other connections (any node), else kept pending for the next `sub`.
-- KEYS: 1 the topic's v1 subscriber counts (hash: field "<node hex>:<worker>" -> count),
--       2 the topic's pending frames (list of "<expiry ms>:<frame>"), 3 the webhook set.
-- ARGV: 1 frame, 2 self_subscribed ("1": the publishing connection is itself a subscriber
--       and does not count), 3 origin (16 bytes), 4 prompt ("1": return the webhooks),
--       5 pub/sub channel, 6 pending ttl ms, 7 max pending per topic, 8 node key prefix
--       ("wr:node:"), 9 node key lifetime ms, 10 node liveness ms, 11 PUBLISH (or SPUBLISH
--       on a Redis Cluster), 12 node key suffix ("", or ":{tag}" on a Redis Cluster: each
--       node keeps a liveness key in every slot where it has v1 subscribers, as a script
--       reads only keys of its topic's slot there).
-- A node's key is set for ARGV[9] ms at every heartbeat: its counts count while the key was
-- refreshed within the last ARGV[10] ms; a node whose key is gone (silent for ARGV[9] ms)
-- has its fields removed.
-- Returns {1 sent live | 0 kept pending, url...} (urls only when prompt).
local subs = redis.call('HGETALL', KEYS[1])
local forget, alive_ms = tonumber(ARGV[9]), tonumber(ARGV[10])
local total, seen, gone = 0, {}, {}
for i = 1, #subs, 2 do
  local field = subs[i]
  local node = string.match(field, '^([^:]*)')
  local state = seen[node]
  if state == nil then
    local ttl = redis.call('PTTL', ARGV[8] .. node .. ARGV[12])
    if ttl < 0 then state = 'gone' elseif ttl > forget - alive_ms then state = 'alive' else state = 'dead' end
    seen[node] = state
  end
  if state == 'alive' then
    total = total + (tonumber(subs[i + 1]) or 0)
  elseif state == 'gone' then
    gone[#gone + 1] = field
  end
end
for i = 1, #gone do redis.call('HDEL', KEYS[1], gone[i]) end
if ARGV[2] == '1' then total = total - 1 end
local out
if total > 0 then
  redis.call(ARGV[11], ARGV[5], '0:0:' .. ARGV[3] .. ARGV[1])
  out = {1}
else
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local exp = string.format('%d', now + tonumber(ARGV[6]))
  redis.call('RPUSH', KEYS[2], exp .. ':' .. ARGV[1])
  redis.call('LTRIM', KEYS[2], -tonumber(ARGV[7]), -1)
  -- The list lives as long as its newest frame.
  redis.call('PEXPIREAT', KEYS[2], exp)
  out = {0}
end
if ARGV[4] == '1' then
  local urls = redis.call('SMEMBERS', KEYS[3])
  for i = 1, #urls do out[i + 1] = urls[i] end
end
return out
