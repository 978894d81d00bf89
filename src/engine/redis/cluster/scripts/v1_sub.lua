-- v1_sub: a worker's v1 subscriber count of a topic, and (optionally) the topic's pending
-- frames taken, atomically: a `pub` runs either before (its frame is pending and taken
-- here) or after (it sees the count and publishes live).
-- KEYS: 1 the topic's v1 subscriber counts, 2 the topic's pending frames.
-- ARGV: 1 this worker's field ("<node hex>:<worker>"), 2 its count (0: the field goes),
--       3 take ("1"/"0").
-- Returns the unexpired pending frames, oldest first (none when not taking); they are gone.
if tonumber(ARGV[2]) > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
if ARGV[3] ~= '1' then return {} end
local items = redis.call('LRANGE', KEYS[2], 0, -1)
if #items == 0 then return {} end
redis.call('DEL', KEYS[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #items do
  local x, frame = string.match(items[i], '^(%d+):(.*)$')
  if x and tonumber(x) > now then out[#out + 1] = frame end
end
return out
