-- read: a topic's cached, unexpired messages after a position, oldest first.
-- KEYS: 1 meta hash, 2 stream.
-- ARGV: 1 epoch the reader knows ("0": none), 2 after seq (ignored when the epoch differs:
--       the reader's positions mean nothing then), 3 max data bytes, 4 max entries scanned.
-- Returns {epoch ("0": no history), last seq, scanned up to, seq, data, origin, expiry, ...}:
-- "scanned up to" < last seq means more to read after it.
local m = redis.call('HMGET', KEYS[1], 'e', 's')
if not m[1] or redis.call('EXISTS', KEYS[2]) == 0 then return {'0', 0, 0} end
local epoch, last = m[1], tonumber(m[2])
local after = ARGV[2]
if ARGV[1] ~= epoch then after = '0' end
local max_bytes, count = tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local entries = redis.call('XRANGE', KEYS[2], '(' .. after .. '-0', '+', 'COUNT', count)
local out = {epoch, last, last}
local bytes, n = 0, 3
for i, e in ipairs(entries) do
  local f = e[2]
  local s = tonumber(string.match(e[1], '^(%d+)'))
  local x = tonumber(f[4])
  if x > now then
    out[n + 1], out[n + 2], out[n + 3], out[n + 4] = s, f[2], f[6], x
    n = n + 4
    bytes = bytes + #f[2]
  end
  if (bytes >= max_bytes or i == count) and s < last then
    out[3] = s
    break
  end
end
return out
