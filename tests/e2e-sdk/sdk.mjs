#!/usr/bin/env node
// End-to-end tests of walletrelay with today's WalletConnect SDK, @walletconnect/sign-client
// 2.25.0 from npm (irn_* relay protocol, wc_proposeSession / wc_approveSession, JWT relay auth),
// used unchanged. A dApp client and a wallet client run in this one process (two SignClients,
// each with its own customStoragePrefix and in-memory storage).
//
//   SCENARIO=session RELAY_URL=ws://127.0.0.1:PORT node sdk.mjs
//
// Scenarios (SCENARIO, default "session": session, offline, restart, cluster, idle,
// unsubscribe, failover, upgrade), the environment (RELAY_URL, PROJECT_ID, E2E_TIMEOUT_MS, WC_LOG_LEVEL,
// WIRE_LOG, IDLE_SECONDS) and what every scenario checks besides (nothing fetched outside
// loopback, unhandled rejections counted): README.md.
//
// Exit status 0 on success; 1 with "FAIL: <reason>" on stderr otherwise, also on the timeout.

import { createRequire } from "node:module";
import readline from "node:readline";
import { offline, within } from "../e2e-common/offline.mjs";
import { watchWire } from "./wire.mjs";

const SCENARIO = process.env.SCENARIO || "session";
const RELAY_URLS = (process.env.RELAY_URL || "")
  .split(",")
  .map((u) => u.trim())
  .filter(Boolean);
const PROJECT_ID = process.env.PROJECT_ID || "walletrelay-test";
const LOG_LEVEL = process.env.WC_LOG_LEVEL || "error";
const WIRE_LOG = process.env.WIRE_LOG === "1";
const IDLE_SECONDS = Number(process.env.IDLE_SECONDS || 70);
const TIMEOUT_MS = Number(
  process.env.E2E_TIMEOUT_MS || 120000 + (SCENARIO === "idle" ? IDLE_SECONDS * 1000 : 0),
);
const T0 = Date.now();

const CHAIN = "eip155:1";
const METHODS = ["personal_sign", "eth_sendTransaction"];
const EVENTS = ["chainChanged", "accountsChanged"];
const ADDRESS = "0x8fd379246834eac74b8419ffda202cf8051f7a03";
const ADDRESS2 = "0x1111111111111111111111111111111111111111";
const ACCOUNT = `${CHAIN}:${ADDRESS}`;
const ACCOUNT2 = `${CHAIN}:${ADDRESS2}`;
const SIGNATURE = "0x" + "ab".repeat(65);
const DAPP_METADATA = {
  name: "walletrelay sdk e2e dApp",
  description: "dApp side of the walletrelay SDK end-to-end test",
  url: "https://dapp.example.org",
  icons: ["https://dapp.example.org/icon.png"],
};
const WALLET_METADATA = {
  name: "walletrelay sdk e2e wallet",
  description: "Wallet side of the walletrelay SDK end-to-end test",
  url: "https://wallet.example.org",
  icons: ["https://wallet.example.org/icon.png"],
};

// ---------------------------------------------------------------------------------------------
// Logging, failure, overall timeout

function log(who, msg) {
  const t = ((Date.now() - T0) / 1000).toFixed(3).padStart(8);
  console.log(`[${t}s] ${who.padEnd(7)} ${msg}`);
}

let failing = false;
async function fail(msg) {
  if (failing) return;
  failing = true;
  console.error(`FAIL (${SCENARIO}): ${msg}`);
  console.error(`fetch calls recorded: ${JSON.stringify(fetched)}`);
  console.error(
    `relay errors and closes seen on the wire (${wireTrouble.length}):\n  ${wireTrouble.slice(-20).join("\n  ") || "none"}`,
  );
  console.error(`unhandled rejections: ${unhandled.length}`);
  await cleanup().catch(() => {});
  process.exit(1);
}

function assert(cond, msg) {
  if (!cond) throw new Error(`assertion failed: ${msg}`);
}
function assertEq(actual, expected, what) {
  const a = JSON.stringify(actual);
  const e = JSON.stringify(expected);
  if (a !== e) throw new Error(`assertion failed: ${what}: expected ${e}, got ${a}`);
}

const overall = setTimeout(
  () => fail(`overall timeout of ${TIMEOUT_MS} ms passed (last step: ${step})`),
  TIMEOUT_MS,
);
let step = "start";
function begin(name) {
  step = name;
  log("test", `--- ${name}`);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------------------------------------
// The environment the SDK runs in: no network besides the relay

const { fetched, unhandled } = offline(log);

// The SDK's frames on the wire (wire.mjs): error answers and closes kept for the failure
// message, publishes and pushes by tag; with WIRE_LOG=1 every frame is printed.
const require = createRequire(import.meta.url);
const { wireTrouble, tagged } = watchWire({ log, wireLog: WIRE_LOG, t0: T0 });

// stdin, for SCENARIO=restart, failover and upgrade: lines are kept from the start so that
// none is missed.
const stdinLines = [];
const stdinWaiters = [];
let stdinClosed = false;
if (SCENARIO === "restart" || SCENARIO === "failover" || SCENARIO === "upgrade") {
  const rl = readline.createInterface({ input: process.stdin });
  const wake = () => stdinWaiters.splice(0).forEach((w) => w());
  rl.on("line", (line) => {
    log("stdin", line);
    stdinLines.push(line.trim());
    wake();
  });
  rl.on("close", () => {
    stdinClosed = true;
    wake();
  });
}

const { SignClient } = await import("@walletconnect/sign-client");

// ---------------------------------------------------------------------------------------------
// Clients and their events

const clients = [];

/** A SignClient with its events queued, so that no event is missed between steps. */
async function makeClient(role, relayUrl) {
  const client = await SignClient.init({
    projectId: PROJECT_ID,
    relayUrl,
    customStoragePrefix: `walletrelay-e2e-${role}-${process.pid}-${T0}`,
    logger: LOG_LEVEL,
    telemetryEnabled: false,
    metadata: role === "dapp" ? DAPP_METADATA : WALLET_METADATA,
  });
  const c = { role, client, queues: new Map(), waiters: new Map(), transport: [] };
  for (const ev of [
    "session_proposal",
    "session_request",
    "session_event",
    "session_update",
    "session_extend",
    "session_ping",
    "session_delete",
    "session_expire",
    "proposal_expire",
  ]) {
    client.on(ev, (payload) => {
      log(role, `event ${ev} ${JSON.stringify(payload).slice(0, 300)}`);
      push(c, ev, payload);
    });
  }
  for (const ev of [
    "relayer_connect",
    "relayer_disconnect",
    "relayer_transport_closed",
    "relayer_connection_stalled",
    "relayer_error",
  ]) {
    client.core.relayer.on(ev, (e) => {
      c.transport.push({ ev, at: Date.now() });
      log(role, `relayer ${ev}${e?.message ? `: ${e.message}` : ""}`);
      if (SCENARIO === "upgrade" && ev === "relayer_connect") reportReconnect(c);
    });
  }
  clients.push(c);
  log(role, `SignClient ready, relayUrl ${relayUrl}, client id ${await client.core.crypto.getClientId()}`);
  return c;
}

/**
 * SCENARIO=upgrade: a line `RECONNECTED <role> <ms>` on stdout when a client is connected
 * again after its socket was cut (not after the wallet's own transportClose): the time from
 * the cut to the new connection.
 */
function reportReconnect(c) {
  const t = c.transport;
  const down = t.slice(0, -1).findLast((e) => e.ev === "relayer_disconnect");
  if (!down || t.slice(t.indexOf(down) + 1, -1).some((e) => e.ev === "relayer_connect")) return;
  if (c.closedByTest && c.closedByTest >= down.at - 1000) return;
  console.log(`RECONNECTED ${c.role} ${t[t.length - 1].at - down.at}`);
}

function push(c, ev, payload) {
  const w = c.waiters.get(ev);
  if (w && w.length) return w.shift()(payload);
  if (!c.queues.has(ev)) c.queues.set(ev, []);
  c.queues.get(ev).push(payload);
}

/** The next `ev` of client `c` (already queued or yet to come), within `ms`. */
function next(c, ev, ms = 30000) {
  const q = c.queues.get(ev);
  if (q && q.length) return Promise.resolve(q.shift());
  const p = new Promise((resolve) => {
    if (!c.waiters.has(ev)) c.waiters.set(ev, []);
    c.waiters.get(ev).push(resolve);
  });
  return within(p, ms, `${c.role} waiting for ${ev}`);
}

async function cleanup() {
  for (const { client } of clients) {
    try {
      client.core.heartbeat.stop();
    } catch {}
    try {
      await within(client.core.relayer.transportClose(), 3000, "transportClose");
    } catch {}
  }
}

// ---------------------------------------------------------------------------------------------
// Steps

const NAMESPACES = { eip155: { chains: [CHAIN], methods: METHODS, events: EVENTS } };

/** connect (dApp) + pair (wallet) + approve (wallet) -> the session both sides agree on. */
async function makeSession(dapp, wallet) {
  begin("connect / pair / approve");
  const { uri, approval } = await within(
    dapp.client.connect({ requiredNamespaces: NAMESPACES, optionalNamespaces: NAMESPACES }),
    30000,
    "dApp connect()",
  );
  assert(uri && uri.startsWith("wc:"), `pairing URI ${uri}`);
  log("dapp", `pairing URI ${uri}`);
  const sessionP = within(approval(), 60000, "dApp approval() (the session settlement)");
  sessionP.catch(() => {});
  await within(wallet.client.pair({ uri }), 30000, "wallet pair({uri})");
  const proposal = await next(wallet, "session_proposal", 30000);
  const { params } = proposal;
  assertEq(params.proposer.metadata.name, DAPP_METADATA.name, "proposer metadata name");
  const all = { ...params.requiredNamespaces, ...params.optionalNamespaces };
  assert(all.eip155, `proposal namespaces ${JSON.stringify(all)}`);
  const chains = [
    ...(params.requiredNamespaces?.eip155?.chains || []),
    ...(params.optionalNamespaces?.eip155?.chains || []),
  ];
  assert(chains.includes(CHAIN), `proposal chains ${JSON.stringify(chains)}`);
  const methods = [
    ...(params.requiredNamespaces?.eip155?.methods || []),
    ...(params.optionalNamespaces?.eip155?.methods || []),
  ];
  for (const m of METHODS) assert(methods.includes(m), `proposal methods include ${m}`);
  const { topic, acknowledged } = await within(
    wallet.client.approve({
      id: proposal.id,
      namespaces: { eip155: { chains: [CHAIN], accounts: [ACCOUNT], methods: METHODS, events: EVENTS } },
    }),
    30000,
    "wallet approve()",
  );
  log("wallet", `approved, session topic ${topic}`);
  const walletAck = within(acknowledged(), 30000, "wallet approve's acknowledged()");
  walletAck.catch(() => {});
  const session = await sessionP;
  assertEq(session.topic, topic, "dApp's session topic");
  assertEq(session.namespaces.eip155.accounts, [ACCOUNT], "dApp's session accounts");
  assertEq(session.peer.metadata.name, WALLET_METADATA.name, "dApp's session peer name");
  const walletSession = await walletAck;
  assertEq(walletSession.topic, topic, "wallet's session topic");
  assertEq(walletSession.peer.metadata.name, DAPP_METADATA.name, "wallet's session peer name");
  log("test", `session settled on both sides: ${topic}`);
  return topic;
}

/** The wallet answers the next personal_sign with `sig`. */
async function answerNextRequest(wallet, topic, message, sig, ms = 30000) {
  const ev = await next(wallet, "session_request", ms);
  assertEq(ev.topic, topic, "session_request topic");
  assertEq(ev.params.chainId, CHAIN, "session_request chainId");
  assertEq(ev.params.request.method, "personal_sign", "session_request method");
  assertEq(ev.params.request.params, [message, ADDRESS], "session_request params");
  await within(
    wallet.client.respond({ topic, response: { id: ev.id, jsonrpc: "2.0", result: sig } }),
    30000,
    "wallet respond()",
  );
  log("wallet", `answered request ${ev.id}`);
  return ev;
}

function hexMessage(text) {
  return "0x" + Buffer.from(text, "utf8").toString("hex");
}

function sendRequest(dapp, topic, message) {
  return dapp.client.request({
    topic,
    chainId: CHAIN,
    request: { method: "personal_sign", params: [message, ADDRESS] },
  });
}

/** One personal_sign round trip while both are online. */
async function roundTrip(dapp, wallet, topic, n) {
  begin(`personal_sign request #${n}`);
  const message = hexMessage(`walletrelay sdk e2e request #${n}`);
  const sig = SIGNATURE.slice(0, -2) + String(n).padStart(2, "0");
  const resultP = within(sendRequest(dapp, topic, message), 60000, `dApp request #${n}`);
  resultP.catch(() => {});
  await answerNextRequest(wallet, topic, message, sig);
  const result = await resultP;
  assertEq(result, sig, `dApp's result of request #${n}`);
  log("dapp", `got result of request #${n}`);
}

/**
 * What the wire showed of a request (tag `reqTag`) and its answer (`resTag`): when the relay
 * answered the publish of the request and when the answer was pushed back. The SDK's
 * update()/extend() `acknowledged()` is lost when the answer comes before the relay's `true`
 * to the publish has been handled.
 */
function ackOrder(reqTag, resTag) {
  const t = (e) => (e ? `+${e.at - T0} ms on #${e.conn}` : "never");
  const find = (tag, kind) => [...tagged].reverse().find((e) => e.tag === tag && e.kind === kind);
  const sent = find(reqTag, "sent");
  const answered = find(reqTag, "answered");
  const pushed = find(resTag, "pushed");
  const race = answered && pushed && pushed.at - answered.at <= 2 ? " (the peer's answer came with or right after the relay's true: the relay answered the publish late, after delivering it)" : "";
  const order = answered && pushed && pushed.at < answered.at ? " (the peer's answer came BEFORE the relay's true to the publish)" : race;
  return `publish tag ${reqTag} sent ${t(sent)}, answered true ${t(answered)}; the peer's answer (tag ${resTag}) pushed ${t(pushed)}${order}`;
}

/**
 * Waits (30 s) until the peer's answer to `c`'s request `id` (an update or an extend) reached
 * `c`: its `acknowledged()` promise `ack` resolves, or `c`'s JSON-RPC history holds the answer.
 *
 * `acknowledged()` is called as soon as update()/extend() return, but the SDK still loses it
 * when the peer's answer is handled before the relay's `true` to the request's publish (both
 * read in one chunk: utils createDelayedPromise drops a resolve() that comes before done()).
 * That is noted in the log with the wire order, and the history is what counts.
 */
async function answered(c, id, ack, what, reqTag, resTag) {
  let acked = false;
  ack.then(() => (acked = true), () => {});
  const end = Date.now() + 30000;
  for (;;) {
    if (acked) return;
    const rec = c.client.core.history.records.get(id);
    const pushed = tagged.some((e) => e.tag === resTag && e.kind === "pushed");
    if (pushed && (rec === undefined || rec.response !== undefined)) {
      await sleep(200);
      if (acked) return;
      if (rec?.response?.error) throw new Error(`${what} answered with an error: ${JSON.stringify(rec.response)}`);
      log(
        c.role,
        `note: ${what}'s answer arrived (history), but the SDK's acknowledged() did not resolve: ${ackOrder(reqTag, resTag)}`,
      );
      return;
    }
    if (Date.now() > end) throw new Error(`${what} was never answered: ${ackOrder(reqTag, resTag)}`);
    await sleep(50);
  }
}

/** Resolves when the relay acknowledged (answered `true` to) a publish of `c` with tag `tag`. */
function publishAcked(c, tag, ms = 30000) {
  const p = new Promise((resolve) => {
    const h = (req) => {
      if (req?.params?.tag === tag) {
        c.client.core.relayer.events.removeListener("relayer_publish", h);
        resolve(req);
      }
    };
    c.client.core.relayer.events.on("relayer_publish", h);
  });
  return within(p, ms, `the relay acknowledging ${c.role}'s publish with tag ${tag}`);
}

/** The request while the wallet is offline; `whileOffline` runs once the relay has it. */
async function offlineRequest(dapp, wallet, topic, whileOffline) {
  begin("wallet goes offline (transportClose)");
  wallet.closedByTest = Date.now();
  await within(wallet.client.core.relayer.transportClose(), 10000, "wallet transportClose()");
  await sleep(500);
  begin("dApp sends a request while the wallet is offline");
  const message = hexMessage("walletrelay sdk e2e request while the wallet is offline");
  const sig = SIGNATURE.slice(0, -2) + "ff";
  const acked = publishAcked(dapp, 1108);
  const resultP = within(sendRequest(dapp, topic, message), OFFLINE_MS, "dApp's offline request");
  resultP.catch(() => {});
  await acked;
  log("dapp", "request publish acknowledged by the relay");
  assertEq(wallet.queues.get("session_request")?.length ?? 0, 0, "requests the offline wallet got");
  if (whileOffline) await whileOffline();
  begin("wallet comes back (transportOpen)");
  await within(wallet.client.core.relayer.transportOpen(), 30000, "wallet transportOpen()");
  await answerNextRequest(wallet, topic, message, sig, 45000);
  const result = await resultP;
  assertEq(result, sig, "dApp's result of the offline request");
  log("dapp", "got the result of the request made while the wallet was offline");
}

/** How long the offline request may wait for its answer (OFFLINE_MS, default 120 s). */
const OFFLINE_MS = Number(process.env.OFFLINE_MS || 120000);

/** Resolves when a line `expected` came on stdin (read in SCENARIO=restart, failover, upgrade). */
function readLine(expected, ms) {
  const p = new Promise((resolve, reject) => {
    const check = () => {
      if (stdinLines.includes(expected)) return resolve();
      if (stdinClosed) return reject(new Error(`stdin closed before a line ${expected}`));
      stdinWaiters.push(check);
    };
    check();
  });
  return within(p, ms, `line ${expected} on stdin`);
}

// ---------------------------------------------------------------------------------------------
// Scenarios

async function scenarioSession(dapp, wallet) {
  const topic = await makeSession(dapp, wallet);
  await roundTrip(dapp, wallet, topic, 1);

  begin("wallet emit -> dApp session_event");
  await within(
    wallet.client.emit({ topic, chainId: CHAIN, event: { name: "accountsChanged", data: [ADDRESS2] } }),
    30000,
    "wallet emit()",
  );
  const ev = await next(dapp, "session_event");
  assertEq(ev.topic, topic, "session_event topic");
  assertEq(ev.params.chainId, CHAIN, "session_event chainId");
  assertEq(ev.params.event, { name: "accountsChanged", data: [ADDRESS2] }, "session_event event");

  begin("wallet update -> dApp session_update");
  const namespaces = {
    eip155: { chains: [CHAIN], accounts: [ACCOUNT, ACCOUNT2], methods: METHODS, events: EVENTS },
  };
  const upd = await within(wallet.client.update({ topic, namespaces }), 30000, "wallet update()");
  const updAck = upd.acknowledged();
  const up = await next(dapp, "session_update");
  assertEq(up.topic, topic, "session_update topic");
  assertEq(up.params.namespaces.eip155.accounts, [ACCOUNT, ACCOUNT2], "session_update accounts");
  await answered(wallet, up.id, updAck, "update", 1104, 1105);
  assertEq(
    dapp.client.session.get(topic).namespaces.eip155.accounts,
    [ACCOUNT, ACCOUNT2],
    "dApp's stored session accounts after update",
  );

  begin("wallet extend -> dApp session_extend");
  const before = dapp.client.session.get(topic).expiry;
  await sleep(1100); // expiries are in seconds: make the extended one differ
  const ext = await within(wallet.client.extend({ topic }), 30000, "wallet extend()");
  const extAck = ext.acknowledged();
  const ex = await next(dapp, "session_extend");
  assertEq(ex.topic, topic, "session_extend topic");
  await answered(wallet, ex.id, extAck, "extend", 1106, 1107);
  const after = dapp.client.session.get(topic).expiry;
  assert(after > before, `dApp's session expiry grew on extend (${before} -> ${after})`);

  begin("dApp ping");
  await within(dapp.client.ping({ topic }), 30000, "dApp ping()");
  const ping = await next(wallet, "session_ping");
  assertEq(ping.topic, topic, "session_ping topic");

  begin("wallet disconnect -> dApp session_delete");
  await within(
    wallet.client.disconnect({ topic, reason: { code: 6000, message: "User disconnected." } }),
    30000,
    "wallet disconnect()",
  );
  const del = await next(dapp, "session_delete");
  assertEq(del.topic, topic, "session_delete topic");
  await sleep(200);
  assertEq(dapp.client.session.keys.includes(topic), false, "dApp still holds the deleted session");
}

/** Session, disconnect, then a message on the old session topic reaches neither client. */
async function scenarioUnsubscribe(dapp, wallet) {
  const topic = await makeSession(dapp, wallet);
  await roundTrip(dapp, wallet, topic, 1);
  begin("wallet disconnect -> dApp session_delete");
  await within(
    wallet.client.disconnect({ topic, reason: { code: 6000, message: "User disconnected." } }),
    30000,
    "wallet disconnect()",
  );
  const del = await next(dapp, "session_delete");
  assertEq(del.topic, topic, "session_delete topic");
  begin("after the delete both clients are unsubscribed from the session topic");
  // Both sent irn_unsubscribe {topic, id} with the id the SDK computes itself,
  // sha256_hex(topic + clientId). A third connection publishes on the old topic: neither
  // client's socket may get it.
  await sleep(500); // the unsubscribes are answered
  await publishFromOutside(RELAY_URLS[0], topic, STRAY_TAG);
  await sleep(1000);
  const strays = tagged.filter((e) => e.tag === STRAY_TAG && e.kind === "pushed");
  assertEq(
    strays.map((e) => `pushed on #${e.conn}`),
    [],
    "pushes of a message published on the session topic after both clients unsubscribed " +
      "(the relay kept a subscription the SDK's irn_unsubscribe named by its own id)",
  );
}

const STRAY_TAG = 4242;

/** Publishes a dummy message on `topic` from a connection of its own, without auth. */
async function publishFromOutside(url, topic, tag) {
  const WS = require("ws");
  const ws = new WS(url);
  await within(new Promise((resolve, reject) => {
    ws.once("open", resolve);
    ws.once("error", reject);
  }), 10000, `a third connection to ${url}`);
  const id = 4242;
  const answer = new Promise((resolve) => {
    ws.on("message", (data) => {
      const m = JSON.parse(String(data));
      if (m.id === id) resolve(m);
    });
  });
  ws.send(JSON.stringify({
    id,
    jsonrpc: "2.0",
    method: "irn_publish",
    params: { topic, message: Buffer.from("walletrelay e2e stray").toString("base64"), ttl: 300, tag, prompt: false },
  }));
  const m = await within(answer, 10000, "the answer to the third connection's irn_publish");
  assertEq(m.result, true, "the third connection's irn_publish answer");
  ws.close();
}

async function scenarioOffline(dapp, wallet) {
  const topic = await makeSession(dapp, wallet);
  await roundTrip(dapp, wallet, topic, 1);
  await offlineRequest(dapp, wallet, topic);
}

async function scenarioRestart(dapp, wallet) {
  const topic = await makeSession(dapp, wallet);
  await roundTrip(dapp, wallet, topic, 1);
  await offlineRequest(dapp, wallet, topic, async () => {
    begin("relay restart");
    console.log("READY_FOR_RESTART");
    await readLine("RESTARTED", 60000);
    log("test", "the relay was restarted");
  });
}

/**
 * Both clients on one URL (a load balancer in front of several relays): session and a
 * request, then `FAILOVER_ROUNDS` (default 1) rounds of: `READY_FOR_KILL <round>` on stdout,
 * the test stops or kills the relay (or relays) holding the clients' sockets and writes
 * `KILLED <round>`; every client whose socket was cut must reconnect (a `relayer_connect`
 * after its `relayer_disconnect`), and a further request gets its answer.
 */
async function scenarioFailover(dapp, wallet) {
  const topic = await makeSession(dapp, wallet);
  await roundTrip(dapp, wallet, topic, 1);
  const rounds = Number(process.env.FAILOVER_ROUNDS || 1);
  for (let round = 1; round <= rounds; round++) {
    begin(`round ${round}: a relay is stopped or killed under the session`);
    const from = Date.now();
    console.log(`READY_FOR_KILL ${round}`);
    await readLine(`KILLED ${round}`, 120000);
    log("test", "the relay is gone");
    begin(`round ${round}: the cut clients reconnect through the load balancer`);
    const cut = () =>
      [dapp, wallet].filter((c) =>
        c.transport.some((t) => t.at >= from && t.ev === "relayer_disconnect"),
      );
    const back = (c) => {
      const down = c.transport.findLast((t) => t.at >= from && t.ev === "relayer_disconnect");
      return c.transport.some((t) => t.ev === "relayer_connect" && t.at >= down.at);
    };
    const end = Date.now() + 30000;
    while (cut().length === 0) {
      if (Date.now() > end) throw new Error("no client saw its socket closed");
      await sleep(50);
    }
    while (!cut().every(back)) {
      if (Date.now() > end) {
        throw new Error(`not reconnected within 30 s: ${cut().filter((c) => !back(c)).map((c) => c.role)}`);
      }
      await sleep(50);
    }
    log("test", `round ${round}: reconnected: ${cut().map((c) => c.role).join(", ")}`);
    await roundTrip(dapp, wallet, topic, round + 1);
  }
}

/**
 * Both clients on one URL (a load balancer in front of relays the test upgrades one by one):
 * session and a request; the wallet goes offline, the dApp sends a request, `WALLET_OFFLINE`
 * on stdout; the test replaces the relays (the dApp's socket is cut on the way: a line
 * `RECONNECTED dapp <ms>` each time it is connected again) and writes `UPGRADED`; the wallet
 * comes back and gets the request, a second request round-trips; `READY_FOR_SWITCH`, the test
 * switches the cluster's data layout and writes `SWITCHED`; a third request round-trips.
 */
async function scenarioUpgrade(dapp, wallet) {
  const topic = await makeSession(dapp, wallet);
  await roundTrip(dapp, wallet, topic, 1);
  await offlineRequest(dapp, wallet, topic, async () => {
    begin("the relays are upgraded while the wallet is offline");
    console.log("WALLET_OFFLINE");
    await readLine("UPGRADED", OFFLINE_MS);
    log("test", "the relays were upgraded");
  });
  await roundTrip(dapp, wallet, topic, 2);
  begin("the cluster's data layout is switched");
  console.log("READY_FOR_SWITCH");
  await readLine("SWITCHED", 120000);
  await roundTrip(dapp, wallet, topic, 3);
}

async function scenarioCluster(dapp, wallet) {
  const topic = await makeSession(dapp, wallet);
  await roundTrip(dapp, wallet, topic, 1);
}

async function scenarioIdle(dapp, wallet) {
  const topic = await makeSession(dapp, wallet);
  await roundTrip(dapp, wallet, topic, 1);
  begin(`idle for ${IDLE_SECONDS} s`);
  const from = Date.now();
  await sleep(IDLE_SECONDS * 1000);
  const drops = [dapp, wallet].flatMap((c) =>
    c.transport.filter((t) => t.at >= from).map((t) => `${c.role} ${t.ev} at +${((t.at - from) / 1000).toFixed(1)}s`),
  );
  assertEq(drops, [], "transport events while idle");
  await roundTrip(dapp, wallet, topic, 2);
}

const SCENARIOS = {
  session: scenarioSession,
  offline: scenarioOffline,
  restart: scenarioRestart,
  cluster: scenarioCluster,
  idle: scenarioIdle,
  unsubscribe: scenarioUnsubscribe,
  failover: scenarioFailover,
  upgrade: scenarioUpgrade,
};

// ---------------------------------------------------------------------------------------------

async function main() {
  const run = SCENARIOS[SCENARIO];
  if (!run) throw new Error(`unknown SCENARIO ${SCENARIO} (one of ${Object.keys(SCENARIOS)})`);
  if (RELAY_URLS.length === 0) throw new Error("RELAY_URL is not set");
  if (SCENARIO === "cluster" && RELAY_URLS.length < 2) {
    throw new Error("SCENARIO=cluster needs two comma-separated RELAY_URLs");
  }
  const dappUrl = RELAY_URLS[0];
  const walletUrl = RELAY_URLS[1] ?? RELAY_URLS[0];
  log("test", `scenario ${SCENARIO}, dApp on ${dappUrl}, wallet on ${walletUrl}, project ${PROJECT_ID}`);
  const dapp = await makeClient("dapp", dappUrl);
  const wallet = await makeClient("wallet", walletUrl);
  await run(dapp, wallet);

  begin("checks after the scenario");
  const outside = fetched.filter((u) => {
    try {
      const h = new URL(u).hostname;
      return !(h === "localhost" || h === "127.0.0.1" || h === "[::1]" || h === "::1");
    } catch {
      return true;
    }
  });
  log("test", `fetch calls recorded: ${fetched.length} ${JSON.stringify(fetched)}`);
  assertEq(outside, [], "URLs fetched outside loopback");
  log("test", `unhandled rejections: ${unhandled.length}`);
  await cleanup();
  clearTimeout(overall);
  log("test", `PASS ${SCENARIO}`);
}

main().then(
  () => process.exit(0),
  (e) => fail(e?.stack ?? String(e)),
);
