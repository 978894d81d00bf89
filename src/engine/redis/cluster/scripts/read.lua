-- read: a topic's cached, unexpired messages after a position, oldest first.
-- KEYS: 1 meta hash, 2 stream[, 3 the topic's clients hash: a read for a client id
--       (DECISIONS 13), which starts after the later of the asked position and the
--       client's delivered one].
-- ARGV: 1 epoch the reader knows ("0": none), 2 after seq (ignored when the epoch differs:
--       the reader's positions mean nothing then), 3 max data bytes, 4 max entries scanned,
--       5 the client id (with KEYS[3]).
-- Returns {epoch ("0": no history), last seq, scanned up to, seq, data, origin, expiry, ...}:
-- "scanned up to" < last seq means more to read after it. A read for a client id has two
-- more fields after "scanned up to": "1" when the client has a subscription of the topic
-- (else "0"), and its receipts ("id,id").
local aep, after = ARGV[1], ARGV[2]
local head = 3
local sub, receipts = '0', ''
if KEYS[3] then
  head = 5
  local v = redis.call('HGET', KEYS[3], ARGV[5])
  if v then
    local x, e, s, r = string.match(v, '^(%d+)|(%d+)|(%d+)|([%d,]*)|')
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    -- (A mailbox past its expiry is no subscription: `clients.lua` removes it.)
    if x and (tonumber(x) == 0 or tonumber(x) > now) then
      sub, receipts = '1', r
      local ce, ae = tonumber(e), tonumber(aep)
      if ce > ae or (ce == ae and tonumber(s) > tonumber(after)) then aep, after = e, s end
    end
  end
end
local m = redis.call('HMGET', KEYS[1], 'e', 's')
if not m[1] or redis.call('EXISTS', KEYS[2]) == 0 then
  if head == 5 then return {'0', 0, 0, sub, receipts} end
  return {'0', 0, 0}
end
local epoch, last = m[1], tonumber(m[2])
if aep ~= epoch then after = '0' end
local max_bytes, count = tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local entries = redis.call('XRANGE', KEYS[2], '(' .. after .. '-0', '+', 'COUNT', count)
local out = {epoch, last, last}
if head == 5 then out[4], out[5] = sub, receipts end
local bytes, n = 0, head
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
