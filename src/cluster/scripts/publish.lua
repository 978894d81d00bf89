-- publish: dedup + store + publish one message of one topic, atomically.
-- KEYS: 1 meta hash (e epoch, s last seq, x max expiry ms), 2 stream, 3 dedup hash
--       (sha1 of data -> seq), 4 webhook set of the topic.
-- ARGV: 1 data, 2 ttl ms, 3 origin (16 bytes), 4 prompt ("1"/"0"), 5 max cached per topic,
--       6 pub/sub channel.
-- Returns {1, epoch, seq, url...} when stored (urls only when prompt), {0, epoch, seq} for a
-- duplicate of a message still cached (seq of that message).
local meta, stream, dedup, hooks = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local data, origin = ARGV[1], ARGV[3]
local ttl, cap = tonumber(ARGV[2]), tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local digest = redis.sha1hex(data)
local m = redis.call('HMGET', meta, 'e', 's', 'x')
local epoch, seq, maxx = m[1], tonumber(m[2]), tonumber(m[3])
if epoch and redis.call('EXISTS', stream) == 0 then
  epoch = false -- the stream is gone but not the meta: history lost, start a new epoch
end
if epoch then
  local hit = redis.call('HGET', dedup, digest)
  if hit then
    local e = redis.call('XRANGE', stream, hit .. '-0', hit .. '-0')
    local f = e[1] and e[1][2]
    if f and f[2] == data and tonumber(f[4]) > now then
      return {0, epoch, tonumber(hit)}
    end
  end
else
  epoch = t[1] .. string.format('%06d', tonumber(t[2]))
  seq, maxx = 0, 0
  redis.call('DEL', stream, dedup, meta)
end
seq = seq + 1
local sseq = string.format('%d', seq)
local exp = now + ttl
local sexp = string.format('%d', exp)
redis.call('XADD', stream, sseq .. '-0', 'd', data, 'x', sexp, 'o', origin, 'h', digest)
redis.call('HSET', dedup, digest, sseq)
-- Evict over the cap (oldest first), and up to two expired messages at the head.
local over = redis.call('XLEN', stream) - cap
local head = redis.call('XRANGE', stream, '-', '+', 'COUNT', math.max(over, 0) + 2)
local drop = 0
for i, e in ipairs(head) do
  local f = e[2]
  if i > over and tonumber(f[4]) > now then break end
  local s = string.match(e[1], '^(%d+)')
  if redis.call('HGET', dedup, f[8]) == s then redis.call('HDEL', dedup, f[8]) end
  drop = tonumber(s)
end
if drop > 0 then
  redis.call('XTRIM', stream, 'MINID', string.format('%d', drop + 1) .. '-0')
end
-- All keys but the webhook set live until the last message would expire.
if exp > maxx then
  redis.call('HSET', meta, 'e', epoch, 's', sseq, 'x', sexp)
  redis.call('PEXPIREAT', meta, sexp)
  redis.call('PEXPIREAT', stream, sexp)
  redis.call('PEXPIREAT', dedup, sexp)
else
  redis.call('HSET', meta, 's', sseq)
end
redis.call('PUBLISH', ARGV[6], epoch .. ':' .. sseq .. ':' .. origin .. data)
local out = {1, epoch, seq}
if ARGV[4] == '1' then
  local urls = redis.call('SMEMBERS', hooks)
  for i = 1, #urls do out[i + 3] = urls[i] end
end
return out
