-- publish: for each of a group of messages (one or more, any topics), dedup + store +
-- publish, atomically and in order, so history and live messages share one order.
-- Per message i (0-based), KEYS[3i+1..3i+3]: 1 meta hash: e epoch, s last seq, f first seq,
--   x the keys' expiry (ms), and per cached message one field digest(data) -> seq (the
--   dedup state); 2 stream (id <seq>-0; fields d data, x expiry ms, o origin, h digest);
--   3 the topic's webhook set.
-- ARGV[1] max cached per topic; per message i, ARGV[6i+2..6i+7]: data, ttl ms, origin (16
--   bytes), prompt ("1"/"0"), pub/sub channel, digest of data (xxh3-128, hex; a hint only:
--   a hit is confirmed by comparing the data).
-- Returns one reply per message: {1, epoch, seq, url...} stored (urls only when prompt),
-- {0, epoch, seq} a duplicate of a message still cached (seq of that message).
-- Cost matters: the steady state per message is HMGET, XADD, HSET, PUBLISH.
local cap = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local new_epoch = t[1] .. string.format('%06d', tonumber(t[2]))

-- Drops messages at the head of a stream: the `over` oldest, then expired ones (at most 4).
local function trim(meta, stream, over)
  local head = redis.call('XRANGE', stream, '-', '+', 'COUNT', math.max(over, 0) + 4)
  local drop = 0
  for i, e in ipairs(head) do
    local f = e[2]
    if i > over and tonumber(f[4]) > now then break end
    local s = string.match(e[1], '^(%d+)')
    -- The dedup field goes with its message, unless a newer copy took it over.
    if redis.call('HGET', meta, f[8]) == s then redis.call('HDEL', meta, f[8]) end
    drop = tonumber(s)
  end
  if drop == 0 then return nil end
  redis.call('XTRIM', stream, 'MINID', string.format('%d', drop + 1) .. '-0')
  return string.format('%d', drop + 1)
end

local function publish(meta, stream, hooks, data, ttl, origin, prompt, channel, digest)
  local m = redis.call('HMGET', meta, 'e', 's', 'f', 'x', digest)
  local epoch, seq, first, keyx, hit = m[1], tonumber(m[2]), tonumber(m[3]) or 1, tonumber(m[4]) or 0, m[5]
  local extra = nil -- meta fields other than s and the digest, rarely written
  if epoch then
    if hit then
      local e = redis.call('XRANGE', stream, hit .. '-0', hit .. '-0')
      local f = e[1] and e[1][2]
      if f and f[2] == data and tonumber(f[4]) > now then
        return {0, epoch, tonumber(hit)}
      end
    end
  else
    -- No history (never, expired, or lost): a new epoch; clear any remains.
    epoch, seq, first, keyx = new_epoch, 0, 1, 0
    redis.call('DEL', stream, meta)
    extra = {'e', epoch, 'f', '1'}
  end
  seq = seq + 1
  local sseq = string.format('%d', seq)
  local exp = now + ttl
  redis.call('XADD', stream, sseq .. '-0', 'd', data, 'x', string.format('%d', exp), 'o', origin, 'h', digest)
  redis.call('HSET', meta, 's', sseq, digest, sseq)
  -- Past the cap, and on every 32nd message (expired ones at the head), trim.
  local over = seq - first + 1 - cap
  if over > 0 or seq % 32 == 0 then
    local f = trim(meta, stream, over)
    if f then
      extra = extra or {}
      extra[#extra + 1] = 'f'
      extra[#extra + 1] = f
    end
  end
  -- The keys (not the webhook set) live until the last message would expire, extended in
  -- steps of min(ttl, 10 s) so a busy topic does not pay two PEXPIREATs per message.
  if exp > keyx then
    local sx = string.format('%d', exp + math.min(ttl, 10000))
    extra = extra or {}
    extra[#extra + 1] = 'x'
    extra[#extra + 1] = sx
    redis.call('HSET', meta, unpack(extra))
    redis.call('PEXPIREAT', meta, sx)
    redis.call('PEXPIREAT', stream, sx)
  elseif extra then
    redis.call('HSET', meta, unpack(extra))
  end
  redis.call('PUBLISH', channel, epoch .. ':' .. sseq .. ':' .. origin .. data)
  local out = {1, epoch, seq}
  if prompt == '1' then
    local urls = redis.call('SMEMBERS', hooks)
    for i = 1, #urls do out[i + 3] = urls[i] end
  end
  return out
end

local replies = {}
for i = 0, #KEYS / 3 - 1 do
  local k, a = 3 * i, 6 * i + 1
  replies[i + 1] = publish(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[a + 1],
    tonumber(ARGV[a + 2]), ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6])
end
return replies
