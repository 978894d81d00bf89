-- publish: for each of a group of messages (one or more, any topics), dedup + store +
-- publish, atomically and in order, so history and live messages share one order.
-- Per message, KEYS: 1 meta hash: e epoch, s last seq, f first seq, x the keys' expiry (ms),
--   and per cached message one field digest(data) -> seq (the dedup state); 2 the stream,
--   whose name is also the topic's pub/sub channel (id <seq>-0; fields d data, x expiry ms,
--   o origin, h digest); 3 the topic's webhook set, passed only when the message asks for
--   its webhooks (prompt); 4 the topic's clients hash (`clients.lua`), passed always and
--   read only when the meta's field `c` says the topic has client ids (DECISIONS 13).
-- ARGV[1] max cached per topic; ARGV[2] the replication id of the primary the node is
--   talking to (`INFO replication`; "" when unknown): a topic last written under another id
--   was written on a primary that has since been replaced by a replica, which may lack the
--   last writes its old primary assigned positions to and published live (never
--   acknowledged: `WAIT` had not confirmed them). Their seqs must not be reused for other
--   messages, so the topic's seq jumps by 2^20 once under the new id; the meta field `r`
--   holds the id. ARGV[3] the command that sends live messages: PUBLISH, or SPUBLISH on a
--   Redis Cluster (sharded pub/sub: the message crosses only its slot's nodes). ARGV[4]
--   the mailbox ttl ms, 5 the node liveness key prefix, 6 its lifetime ms, 7 how recent a
--   refresh keeps a node alive, ms (the client ids' sockets count on live nodes only), 8
--   "1" while the cluster still writes layout 4 (docs/UPGRADING.md): a layout-4 node's
--   publish drops the meta's field `c` when it starts a new epoch, so a meta without it is
--   checked against the clients hash (one EXISTS) and mended. Per message 8: data (a message::Body), ttl ms, origin (16
--   bytes), prompt ("1"/"0"), digest of the body's beta part (xxh3-128, 16 bytes; a hint
--   only: a hit is confirmed by comparing the first n bytes of both), n (the beta part's
--   length, decimal), the publisher's client id ("" when none), the node key suffix ("",
--   or ":{tag}" of the topic's slot on a Redis Cluster).
-- Returns one flat array, per message: epoch, seq (negative: a duplicate of the message
--   still cached at -seq, nothing stored), n, then n webhook urls (n is 0 unless prompt),
--   k, then k client ids other than the publisher's as (client, project, "1" when a socket
--   on a live node follows the topic for it, else "0") (k is 0 unless the topic has client
--   ids; the publishing node sends their notices and pushes).
-- Cost matters (Redis's one thread runs this for every publish of the cluster): the steady
-- state per message is HMGET, XADD, HSET, PUBLISH; every string made here is hashed byte by
-- byte by this Lua, so the script makes one big string per message (the live payload);
-- numbers go to redis.call as strings formatted once with %d (a Lua number argument costs
-- a %.17g sprintf per use), and strings are parsed only when needed (tonumber is strtod).
local cap = tonumber(ARGV[1])
local term = ARGV[2]
local publish_cmd = ARGV[3]
local mttl, node_prefix = tonumber(ARGV[4]), ARGV[5]
local forget, alive = tonumber(ARGV[6]), tonumber(ARGV[7])
local mixed = ARGV[8] == '1'
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

-- The topic's client ids but the publisher (expired mailboxes removed on the way).
local function clients_of(meta, ckey, publisher, suffix)
  local all = redis.call('HGETALL', ckey)
  if #all == 0 then
    redis.call('HDEL', meta, 'c')
    return {}
  end
  local res, states = {}, {}
  for i = 1, #all, 2 do
    local id, v = all[i], all[i + 1]
    local x, nodes, p = string.match(v, '^(%d+)|%d+|%d+|[%d,]*|([%x:=,]*)|(.*)$')
    if x and id ~= publisher then
      local total = 0
      for node, k in string.gmatch(nodes, '(%x+):?%d*=(%d+)') do
        local st = states[node]
        if st == nil then
          local pt = redis.call('PTTL', node_prefix .. node .. suffix)
          st = pt > forget - alive
          states[node] = st
        end
        if st then total = total + tonumber(k) end
      end
      x = tonumber(x)
      if total == 0 and x > 0 and x <= now then
        redis.call('HDEL', ckey, id)
      else
        if total == 0 and x == 0 then
          -- Its sockets' nodes are gone: its mailbox runs from now.
          redis.call('HSET', ckey, id, string.format('%d', now + mttl) .. string.sub(v, 2))
        end
        res[#res + 1] = id
        res[#res + 1] = p
        res[#res + 1] = total > 0 and '1' or '0'
      end
    end
  end
  redis.call('PEXPIRE', ckey, mttl)
  return res
end

local function publish(meta, stream, hooks, ckey, data, ttl, origin, digest, beta, publisher,
    suffix)
  local m = redis.call('HMGET', meta, 'e', 's', 'f', 'x', digest, 'r', 'c')
  local epoch, seq, hit = m[1], tonumber(m[2]), m[5]
  local extra = nil -- meta fields other than s and the digest, rarely written
  if mixed and epoch and not m[7] and redis.call('EXISTS', ckey) == 1 then
    m[7] = '1'
    redis.call('HSET', meta, 'c', '1')
  end
  if epoch then
    if hit then
      local e = redis.call('XRANGE', stream, hit, hit)
      local f = e[1] and e[1][2]
      local b = tonumber(beta)
      if f and string.sub(f[2], 1, b) == string.sub(data, 1, b) and tonumber(f[4]) > now then
        out[n + 1], out[n + 2], out[n + 3], out[n + 4] = epoch, -tonumber(hit), 0, 0
        n = n + 4
        return
      end
    end
  else
    -- No history (never, expired, or lost): a new epoch; clear any remains.
    epoch, seq = new_epoch, 0
    m[3], m[4] = '1', nil
    redis.call('DEL', stream, meta)
    extra = {'e', epoch, 'f', '1', 'r', term}
    if redis.call('EXISTS', ckey) == 1 then
      m[7] = '1'
      extra[#extra + 1] = 'c'
      extra[#extra + 1] = '1'
    end
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
  if m[7] then
    local cs = clients_of(meta, ckey, publisher, suffix)
    out[n + 1] = #cs / 3
    for i = 1, #cs do out[n + 1 + i] = cs[i] end
    n = n + 1 + #cs
  else
    out[n + 1] = 0
    n = n + 1
  end
end

local k, a = 1, 9
while a <= #ARGV do
  local hooks, nk = nil, 3
  if ARGV[a + 3] == '1' then hooks, nk = KEYS[k + 3], 4 end
  publish(KEYS[k], KEYS[k + 1], hooks, KEYS[k + 2], ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2],
    ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], ARGV[a + 7])
  k, a = k + nk, a + 8
end
return out
