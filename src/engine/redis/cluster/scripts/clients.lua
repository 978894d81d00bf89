-- clients: a client id's subscription of a topic (DECISIONS 13), kept under the topic's
-- hash tag in the topic's clients hash, one field per client id:
--   <client> -> "<expiry ms>|<delivered epoch>|<delivered seq>|<receipts id,id>|<node hex>:<worker>=<sockets>,...|<project>"
-- (expiry 0 while a socket follows the topic for it; each worker's count is absolute (sent
-- again after an outage, so a lost close does not leave a socket behind) and counts only
-- while its node's liveness key was refreshed recently: a node gone has its counts dropped).
-- KEYS: 1 the clients hash, 2 the topic's meta hash (its `e`/`s`: the last position; its
--   field `c` tells the publish script the topic has client ids).
-- ARGV: 1 op (sub: a socket's subscription, sock: this worker's count again if the client
--   has a subscription, http: one without a socket, gone: a socket's close at
--   ARGV[6]:ARGV[7], unsub, deliv: a fetch gave up to ARGV[6]:ARGV[7], recv: the receipts
--   ARGV[8]), 2 client, 3 project, 4 this worker ("<node hex>:<worker>"), 5 mailbox ttl ms, 6 epoch,
--   7 seq, 8 receipts "id,id", 9 node key prefix, 10 node key suffix ("" or ":{tag}"),
--   11 node key lifetime ms, 12 liveness ms, 13 most receipts kept, 14 most client ids per
--   topic (a new one past it is not kept: its socket follows the topic as one without a
--   client id would; the expired mailboxes are swept first), 15 this worker's sockets
--   following the topic for the client now (sub, sock, gone).
-- Reads for a client id are `read.lua`'s. Returns {} ({1} when a new client id found the
-- topic full).
local H, M = KEYS[1], KEYS[2]
local op, client, me = ARGV[1], ARGV[2], ARGV[4]
local ttl, forget, alive = tonumber(ARGV[5]), tonumber(ARGV[11]), tonumber(ARGV[12])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local states = {}
local function live_node(node)
  local st = states[node]
  if st == nil then
    local p = redis.call('PTTL', ARGV[9] .. node .. ARGV[10])
    if p < 0 then st = 'gone' elseif p > forget - alive then st = 'alive' else st = 'dead' end
    states[node] = st
  end
  return st
end

-- The sockets on live nodes before and after this worker's count becomes `mine` (nil: as
-- it is), and the list without the gone nodes.
local function sockets(nodes, mine)
  local before, after, keep, found = 0, 0, {}, false
  for w, n in string.gmatch(nodes, '([%x:]+)=(%d+)') do
    n = tonumber(n)
    local st = live_node(string.match(w, '^(%x+)'))
    if st == 'alive' then before = before + n end
    if w == me then
      found = true
      if mine then n = mine end
      st = 'alive'
    end
    if n > 0 and st ~= 'gone' then keep[#keep + 1] = w .. '=' .. string.format('%d', n) end
    if n > 0 and st == 'alive' then after = after + n end
  end
  if not found and mine and mine > 0 then
    keep[#keep + 1] = me .. '=' .. string.format('%d', mine)
    after = after + mine
  end
  return before, after, table.concat(keep, ',')
end

local function later(e1, s1, e2, s2)
  e1, e2 = tonumber(e1), tonumber(e2)
  return e1 > e2 or (e1 == e2 and tonumber(s1) > tonumber(s2))
end

local mine = nil
if op == 'sub' or op == 'sock' or op == 'gone' then mine = tonumber(ARGV[15]) end
local c = nil
local v = redis.call('HGET', H, client)
if v then
  local x, e, s, r, n, p = string.match(v, '^(%d+)|(%d+)|(%d+)|([%d,]*)|([%x:=,]*)|(.*)$')
  if x then c = {x = tonumber(x), e = e, s = s, r = r, n = n, p = p} end
end
local total = 0
if c then
  local before
  before, total, c.n = sockets(c.n, mine)
  if before == 0 and c.x > 0 and c.x <= now then
    -- Its mailbox expired (no socket since): as if it had none.
    redis.call('HDEL', H, client)
    c = nil
  end
end

if op == 'unsub' then
  redis.call('HDEL', H, client)
  if redis.call('HLEN', H) == 0 then
    redis.call('DEL', H)
    redis.call('HDEL', M, 'c')
  end
  return {}
end
if not c then
  if op ~= 'sub' and op ~= 'http' then return {} end
  if redis.call('HLEN', H) >= tonumber(ARGV[14]) then
    -- A bounded sweep (at most the cap): the mailboxes past their expiry go.
    local all = redis.call('HGETALL', H)
    for i = 1, #all, 2 do
      local x, nodes = string.match(all[i + 1], '^(%d+)|%d+|%d+|[%d,]*|([%x:=,]*)|')
      if x and tonumber(x) > 0 and tonumber(x) <= now then
        local n = sockets(nodes, nil)
        if n == 0 then redis.call('HDEL', H, all[i]) end
      end
    end
    if redis.call('HLEN', H) >= tonumber(ARGV[14]) then return {1} end
  end
  c = {x = 0, e = '0', s = '0', r = '', n = '', p = ARGV[3]}
  total = 0
  if mine and mine > 0 then
    c.n = me .. '=' .. string.format('%d', mine)
    total = mine
  end
  -- The publish script looks at the clients only when the meta says there are some (a
  -- topic with no history yet gets the flag with its first message).
  if redis.call('HEXISTS', M, 'e') == 1 then redis.call('HSET', M, 'c', '1') end
end
if op == 'gone' or op == 'deliv' then
  -- Never past the topic's last position.
  local m = redis.call('HMGET', M, 'e', 's')
  local e, s = ARGV[6], ARGV[7]
  if not m[1] then
    e, s = '0', '0'
  elseif later(e, s, m[1], m[2] or '0') then
    e, s = m[1], m[2] or '0'
  end
  -- (Receipts stay: their positions are not known here; at most ARGV[13] of them.)
  if later(e, s, c.e, c.s) then c.e, c.s = e, s end
elseif op == 'recv' then
  local ids = {}
  local seen = {}
  for id in string.gmatch(c.r, '%d+') do ids[#ids + 1] = id ; seen[id] = true end
  for id in string.gmatch(ARGV[8], '%d+') do
    if not seen[id] then ids[#ids + 1] = id ; seen[id] = true end
  end
  local most = tonumber(ARGV[13])
  while #ids > most do table.remove(ids, 1) end
  c.r = table.concat(ids, ',')
end
if total > 0 then
  c.x = 0
elseif c.x == 0 or op == 'http' or op == 'gone' or op == 'sock' then
  c.x = now + ttl
end
redis.call('HSET', H, client, string.format('%d', c.x) .. '|' .. c.e .. '|' .. c.s .. '|' .. c.r .. '|' .. c.n .. '|' .. c.p)
-- The hash lives a mailbox ttl after its last change or publish (a bounded sweep of what no
-- publish or op comes back to).
redis.call('PEXPIRE', H, ttl)
return {}
