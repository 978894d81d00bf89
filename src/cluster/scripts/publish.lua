-- publish: for each of a group of messages (one or more, any topics), dedup + store +
-- publish, atomically and in order, so history and live messages share one order.
-- Per message, KEYS: 1 meta hash: e epoch, s last seq, f first seq, x the keys' expiry (ms),
--   and per cached message one field digest(data) -> seq (the dedup state); 2 the stream,
--   whose name is also the topic's pub/sub channel (id <seq>-0; fields d data, x expiry ms,
--   o origin, h digest); 3 the topic's webhook set, passed only when the message asks for
--   its webhooks (prompt).
-- ARGV[1] max cached per topic; ARGV[2] the replication id of the primary the node is
--   talking to (`INFO replication`; "" when unknown): a topic last written under another id
--   was written on a primary that has since been replaced by a replica, which may lack the
--   last writes its old primary assigned positions to and published live (never
--   acknowledged: `WAIT` had not confirmed them). Their seqs must not be reused for other
--   messages, so the topic's seq jumps by 2^20 once under the new id; the meta field `r`
--   holds the id. ARGV[3] the command that sends live messages: PUBLISH, or SPUBLISH on a
--   Redis Cluster (sharded pub/sub: the message crosses only its slot's nodes). Per
--   message 6: data (a message::Body), ttl ms, origin (16
--   bytes), prompt ("1"/"0"), digest of the body's beta part (xxh3-128, 16 bytes; a hint
--   only: a hit is confirmed by comparing the first n bytes of both), n (the beta part's
--   length, decimal).
-- Returns one flat array, per message: epoch, seq (negative: a duplicate of the message
--   still cached at -seq, nothing stored), n, then n webhook urls (n is 0 unless prompt).
-- Cost matters (Redis's one thread runs this for every publish of the cluster): the steady
-- state per message is HMGET, XADD, HSET, PUBLISH; every string made here is hashed byte by
-- byte by this Lua, so the script makes one big string per message (the live payload);
-- numbers go to redis.call as strings formatted once with %d (a Lua number argument costs
-- a %.17g sprintf per use), and strings are parsed only when needed (tonumber is strtod).
local cap = tonumber(ARGV[1])
local term = ARGV[2]
local publish_cmd = ARGV[3]
local JUMP = 1048576
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local new_epoch = t[1] .. string.format('%06d', tonumber(t[2]))
local out, n = {}, 0

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
  local f = string.format('%d', drop + 1)
  redis.call('XTRIM', stream, 'MINID', f)
  return f
end

local function publish(meta, stream, hooks, data, ttl, origin, digest, beta)
  local m = redis.call('HMGET', meta, 'e', 's', 'f', 'x', digest, 'r')
  local epoch, seq, hit = m[1], tonumber(m[2]), m[5]
  local extra = nil -- meta fields other than s and the digest, rarely written
  if epoch then
    if hit then
      local e = redis.call('XRANGE', stream, hit, hit)
      local f = e[1] and e[1][2]
      local b = tonumber(beta)
      if f and string.sub(f[2], 1, b) == string.sub(data, 1, b) and tonumber(f[4]) > now then
        out[n + 1], out[n + 2], out[n + 3] = epoch, -tonumber(hit), 0
        n = n + 3
        return
      end
    end
  else
    -- No history (never, expired, or lost): a new epoch; clear any remains.
    epoch, seq = new_epoch, 0
    m[3], m[4] = '1', nil
    redis.call('DEL', stream, meta)
    extra = {'e', epoch, 'f', '1', 'r', term}
  end
  if m[6] ~= term and not extra then
    seq = seq + JUMP
    extra = {'r', term}
  end
  seq = seq + 1
  local sseq = string.format('%d', seq)
  local exp = now + ttl
  local sexp = string.format('%d', exp)
  redis.call('XADD', stream, sseq, 'd', data, 'x', sexp, 'o', origin, 'h', digest)
  redis.call('HSET', meta, 's', sseq, digest, sseq)
  -- Past the cap, and on every 32nd message (expired ones at the head), trim. (The first
  -- seq is >= 1, so below the cap there is no need to read it. Seqs are contiguous but
  -- for a jump: when the span says over, the stream's length says by how much.)
  local over = 0
  if seq > cap and seq - (tonumber(m[3]) or 1) + 1 > cap then
    over = redis.call('XLEN', stream) - cap
  end
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
  -- (Both are ms in decimal with no leading zero: the longer, or else the greater, is later.)
  local keyx = m[4] or ''
  if #sexp > #keyx or (#sexp == #keyx and sexp > keyx) then
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
  redis.call(publish_cmd, stream, epoch .. ':' .. sseq .. ':' .. origin .. data)
  out[n + 1], out[n + 2] = epoch, seq
  if hooks then
    local urls = redis.call('SMEMBERS', hooks)
    out[n + 3] = #urls
    for i = 1, #urls do out[n + 3 + i] = urls[i] end
    n = n + 3 + #urls
  else
    out[n + 3] = 0
    n = n + 3
  end
end

local k, a = 1, 4
while a <= #ARGV do
  local hooks, nk = nil, 2
  if ARGV[a + 3] == '1' then hooks, nk = KEYS[k + 2], 3 end
  publish(KEYS[k], KEYS[k + 1], hooks, ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2], ARGV[a + 4],
    ARGV[a + 5])
  k, a = k + nk, a + 6
end
return out
