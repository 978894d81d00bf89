#!/usr/bin/env node
// A sleeping wallet and the relay's services around it (issue 47, DECISIONS 13), with the
// WalletConnect SDK from npm used unchanged: the dApp is @walletconnect/sign-client 2.25.0, the
// wallet 2.25.0 or 2.17.1 (the npm alias `sign-client-2.17.1`). Driven by tests/sdk_push.rs.
//
//   SCENARIO=push PUSH_URL=http://127.0.0.1:P RELAY_URL=ws://127.0.0.1:R node push.mjs
//
// Scenarios (SCENARIO):
//   push    the wallet registers its client id with the push server through the SDK's own
//           `core.echoClient.registerDeviceToken` (its hard-coded https://echo.walletconnect.com
//           /{projectId}/clients is routed to PUSH_URL/clients: a single-tenant push server of
//           the wallet company's own), type "noop", always_raw ALWAYS_RAW (1/0); session and one
//           request while online; the wallet's transport is closed (relayer.transportClose()); the
//           dApp sends a personal_sign request (irn_publish tag 1108, prompt true); once the
//           relay acknowledged it the script prints `AWAIT_PUSH {client_id, topic, tag, message}`
//           and waits for a line `PUSHED` or `NO_PUSH` on stdin (the test waits for the push at
//           the push server meanwhile); then the wallet comes back (transportOpen()), gets the
//           request, answers; the dApp gets the answer.
//   reconnect-2.25.0 / reconnect-2.17.1   the wallet (that version) is offline while the dApp
//           sends REQUESTS (default 3) requests; it comes back (transportOpen(): 2.25.0 sends
//           irn_batchSubscribe, 2.17.1 irn_batchFetchMessages then irn_batchSubscribe) and must
//           get each exactly once: one session_request per request, and on the wire each message
//           reaches the wallet's sockets once (an irn_subscription push or a fetch result),
//           also after a quiet second; it answers each and the dApp gets every answer.
//
// Env: RELAY_URL, PUSH_URL (push), ALWAYS_RAW (default 1), REQUESTS, PROJECT_ID (default
// "walletrelay-test"), WC_LOG_LEVEL (default "error"), WIRE_LOG=1, E2E_TIMEOUT_MS (default
// 120000). fetch is cut off as in sdk.mjs (e2e-common/offline.mjs), but for the routed
// registration. Exit 0 on success; 1 with "FAIL (<scenario>): <reason>" on stderr.

import { createRequire } from "node:module";
import readline from "node:readline";
import { offline, within } from "../e2e-common/offline.mjs";

const SCENARIO = process.env.SCENARIO || "push";
const RELAY_URL = process.env.RELAY_URL || "";
const PUSH_URL = (process.env.PUSH_URL || "").replace(/\/$/, "");
const ALWAYS_RAW = (process.env.ALWAYS_RAW ?? "1") === "1";
const REQUESTS = Number(process.env.REQUESTS || 3);
const PROJECT_ID = process.env.PROJECT_ID || "walletrelay-test";
const LOG_LEVEL = process.env.WC_LOG_LEVEL || "error";
const WIRE_LOG = process.env.WIRE_LOG === "1";
const TIMEOUT_MS = Number(process.env.E2E_TIMEOUT_MS || 120000);
const ECHO_URL = "https://echo.walletconnect.com"; // core's ECHO_URL, 2.17.1 and 2.25.0
const T0 = Date.now();

const CHAIN = "eip155:1";
const METHODS = ["personal_sign", "eth_sendTransaction"];
const EVENTS = ["chainChanged", "accountsChanged"];
const ADDRESS = "0x8fd379246834eac74b8419ffda202cf8051f7a03";
const ACCOUNT = `${CHAIN}:${ADDRESS}`;
const SIGNATURE = "0x" + "ab".repeat(65);
const NAMESPACES = { eip155: { chains: [CHAIN], methods: METHODS, events: EVENTS } };
const meta = (role) => ({
  name: `walletrelay push e2e ${role}`,
  description: `${role} side of the walletrelay push end-to-end test`,
  url: `https://${role}.example.org`,
  icons: [`https://${role}.example.org/icon.png`],
});

function log(who, msg) {
  const t = ((Date.now() - T0) / 1000).toFixed(3).padStart(8);
  console.log(`[${t}s] ${who.padEnd(7)} ${msg}`);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
function assert(cond, msg) {
  if (!cond) throw new Error(`assertion failed: ${msg}`);
}
function assertEq(actual, expected, what) {
  const a = JSON.stringify(actual);
  const e = JSON.stringify(expected);
  if (a !== e) throw new Error(`assertion failed: ${what}: expected ${e}, got ${a}`);
}
let step = "start";
function begin(name) {
  step = name;
  log("test", `--- ${name}`);
}
const clients = [];
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
let failing = false;
async function fail(msg) {
  if (failing) return;
  failing = true;
  console.error(`FAIL (${SCENARIO}): ${msg}`);
  console.error(`fetch calls recorded: ${JSON.stringify(fetched)}`);
  await cleanup().catch(() => {});
  process.exit(1);
}
const overall = setTimeout(() => fail(`overall timeout of ${TIMEOUT_MS} ms (last step: ${step})`), TIMEOUT_MS);

// The network: the relay only, and the push server for the wallet's registration.
const realFetch = globalThis.fetch;
const { fetched } = offline(log);
const cutOff = globalThis.fetch;
globalThis.fetch = async (input, init) => {
  const url = typeof input === "string" ? input : (input?.url ?? String(input));
  if (PUSH_URL && url === `${ECHO_URL}/${PROJECT_ID}/clients`) {
    log("push", `registration ${init?.body} -> ${PUSH_URL}/clients`);
    const res = await realFetch(`${PUSH_URL}/clients`, init);
    log("push", `POST /clients answered ${res.status}`);
    assertEq(res.status, 200, "the push server's answer to the registration");
    return res;
  }
  return cutOff(input, init);
};

// What reached each client id on the wire: irn_subscription pushes and fetch results, by
// message, with the client id from the socket's auth JWT (`iss`).
const require = createRequire(import.meta.url);
const deliveries = []; // {client, via: "push" | "fetch", tag, message}
const published = []; // {client, tag, topic, message, prompt}
const acked = []; // waiters for the relay's `true` to a publish: {tag, resolve}
{
  const WS = require("ws");
  const clientOf = (ws) => {
    try {
      const jwt = new URL(ws.url).searchParams.get("auth");
      return JSON.parse(Buffer.from(jwt.split(".")[1], "base64url").toString()).iss;
    } catch {
      return "?";
    }
  };
  const pending = new Map(); // request id -> {method, params}
  const origSend = WS.prototype.send;
  WS.prototype.send = function (data, ...rest) {
    if (WIRE_LOG) log("wire", `>> ${data}`);
    try {
      const m = JSON.parse(String(data));
      if (m.method) pending.set(String(m.id), m);
      if (m.method === "irn_publish") published.push({ client: clientOf(this), ...m.params });
    } catch {}
    return origSend.call(this, data, ...rest);
  };
  const origEmit = WS.prototype.emit;
  WS.prototype.emit = function (ev, ...args) {
    if (ev === "message") {
      if (WIRE_LOG) log("wire", `<< ${args[0]}`);
      try {
        const m = JSON.parse(String(args[0]));
        const client = clientOf(this);
        if (m.method === "irn_subscription") {
          const d = m.params.data;
          deliveries.push({ client, via: "push", tag: d.tag, message: d.message });
        }
        const req = pending.get(String(m.id));
        if (req && m.result !== undefined) {
          if (/_(batch)?[fF]etchMessages$/.test(req.method)) {
            for (const d of m.result?.messages ?? []) {
              deliveries.push({ client, via: "fetch", tag: d.tag, message: d.message });
            }
          }
          if (req.method === "irn_publish" && m.result === true) {
            for (const w of acked.filter((w) => w.tag === req.params.tag)) w.resolve(req.params);
          }
        }
        if (m.error) log("wire", `error answer to ${req?.method}: ${JSON.stringify(m.error)}`);
      } catch {}
    } else if (ev === "close") {
      log("wire", `socket closed: code ${args[0]}`);
    }
    return origEmit.call(this, ev, ...args);
  };
}

/** Resolves with the params of the next publish with `tag` the relay answered `true` to. */
function publishAcked(tag, ms = 30000) {
  const p = new Promise((resolve) => {
    const w = { tag, resolve: (params) => (acked.splice(acked.indexOf(w), 1), resolve(params)) };
    acked.push(w);
  });
  return within(p, ms, `the relay acknowledging a publish with tag ${tag}`);
}

// stdin lines (for AWAIT_PUSH), kept from the start.
const stdinLines = [];
const stdinWaiters = [];
readline.createInterface({ input: process.stdin }).on("line", (line) => {
  log("stdin", line);
  stdinLines.push(line.trim());
  stdinWaiters.splice(0).forEach((w) => w());
});
function readOneOf(lines, ms) {
  const p = new Promise((resolve) => {
    const check = () => {
      const l = stdinLines.find((x) => lines.includes(x));
      if (l) return resolve(l);
      stdinWaiters.push(check);
    };
    check();
  });
  return within(p, ms, `a line ${lines.join(" or ")} on stdin`);
}

const { SignClient } = await import("@walletconnect/sign-client");
const { SignClient: SignClient2171 } = await import("sign-client-2.17.1");

async function makeClient(role, Impl, version) {
  const client = await Impl.init({
    projectId: PROJECT_ID,
    relayUrl: RELAY_URL,
    customStoragePrefix: `walletrelay-push-${role}-${process.pid}-${T0}`,
    logger: LOG_LEVEL,
    telemetryEnabled: false,
    metadata: meta(role),
  });
  const c = { role, client, queues: new Map(), waiters: new Map(), id: await client.core.crypto.getClientId() };
  for (const ev of ["session_proposal", "session_request"]) {
    client.on(ev, (payload) => {
      log(role, `event ${ev} ${JSON.stringify(payload).slice(0, 200)}`);
      const w = c.waiters.get(ev);
      if (w && w.length) return w.shift()(payload);
      if (!c.queues.has(ev)) c.queues.set(ev, []);
      c.queues.get(ev).push(payload);
    });
  }
  clients.push(c);
  log(role, `sign-client ${version} ready, client id ${c.id}`);
  return c;
}
function next(c, ev, ms = 30000) {
  const q = c.queues.get(ev);
  if (q && q.length) return Promise.resolve(q.shift());
  const p = new Promise((resolve) => {
    if (!c.waiters.has(ev)) c.waiters.set(ev, []);
    c.waiters.get(ev).push(resolve);
  });
  return within(p, ms, `${c.role} waiting for ${ev}`);
}

async function makeSession(dapp, wallet) {
  begin("connect / pair / approve");
  const { uri, approval } = await within(
    dapp.client.connect({ requiredNamespaces: NAMESPACES }),
    30000,
    "dApp connect()",
  );
  const sessionP = within(approval(), 60000, "dApp approval()");
  sessionP.catch(() => {});
  await within(wallet.client.pair({ uri }), 30000, "wallet pair({uri})");
  const proposal = await next(wallet, "session_proposal");
  const { topic, acknowledged } = await within(
    wallet.client.approve({
      id: proposal.id,
      namespaces: { eip155: { chains: [CHAIN], accounts: [ACCOUNT], methods: METHODS, events: EVENTS } },
    }),
    30000,
    "wallet approve()",
  );
  await within(acknowledged(), 30000, "wallet approve's acknowledged()");
  assertEq((await sessionP).topic, topic, "dApp's session topic");
  log("test", `session ${topic}`);
  return topic;
}

const hexMessage = (text) => "0x" + Buffer.from(text, "utf8").toString("hex");
const sigOf = (n) => SIGNATURE.slice(0, -2) + String(n).padStart(2, "0");
function sendRequest(dapp, topic, n) {
  const message = hexMessage(`walletrelay push e2e request #${n}`);
  const p = within(
    dapp.client.request({ topic, chainId: CHAIN, request: { method: "personal_sign", params: [message, ADDRESS] } }),
    120000,
    `dApp request #${n}`,
  );
  p.catch(() => {});
  return { n, message, result: p };
}
/** The wallet answers the next request; returns the request event. */
async function answerNext(wallet, topic, byMessage, ms = 45000) {
  const ev = await next(wallet, "session_request", ms);
  assertEq(ev.topic, topic, "session_request topic");
  const n = byMessage.get(ev.params.request.params[0]);
  assert(n !== undefined, `a request the dApp sent: ${JSON.stringify(ev.params.request)}`);
  await within(
    wallet.client.respond({ topic, response: { id: ev.id, jsonrpc: "2.0", result: sigOf(n) } }),
    30000,
    "wallet respond()",
  );
  log("wallet", `answered request #${n} (id ${ev.id})`);
  return ev;
}
async function roundTrip(dapp, wallet, topic, n) {
  begin(`request #${n} while both are online`);
  const r = sendRequest(dapp, topic, n);
  await answerNext(wallet, topic, new Map([[r.message, n]]));
  assertEq(await r.result, sigOf(n), `dApp's result of request #${n}`);
}

async function scenarioPush() {
  assert(PUSH_URL, "PUSH_URL is not set");
  const dapp = await makeClient("dapp", SignClient, "2.25.0");
  const wallet = await makeClient("wallet", SignClient, "2.25.0");
  begin("the wallet registers with its push server (echoClient.registerDeviceToken)");
  await within(
    wallet.client.core.echoClient.registerDeviceToken({
      clientId: wallet.id,
      token: `walletrelay-e2e-device-${process.pid}`,
      notificationType: "noop",
      enableEncrypted: ALWAYS_RAW,
    }),
    10000,
    "registerDeviceToken",
  );
  const topic = await makeSession(dapp, wallet);
  await roundTrip(dapp, wallet, topic, 1);
  console.log(`ONLINE_DONE ${JSON.stringify({ client_id: wallet.id })}`);

  begin("the wallet goes offline (transportClose)");
  await within(wallet.client.core.relayer.transportClose(), 10000, "wallet transportClose()");
  await sleep(500);
  begin("the dApp sends a request while the wallet sleeps");
  const ack = publishAcked(1108);
  const r = sendRequest(dapp, topic, 2);
  const params = await ack;
  assertEq(params.prompt, true, "the SDK's session request publish has prompt: true");
  console.log(
    `AWAIT_PUSH ${JSON.stringify({ client_id: wallet.id, topic, tag: 1108, message: params.message })}`,
  );
  const woken = await readOneOf(["PUSHED", "NO_PUSH"], 60000);
  log("test", woken === "PUSHED" ? "the push server got the push: the wallet wakes" : "no push (the test fails at the end); the wallet comes back anyway");

  begin("the wallet comes back (transportOpen)");
  await within(wallet.client.core.relayer.transportOpen(), 30000, "wallet transportOpen()");
  await answerNext(wallet, topic, new Map([[r.message, 2]]));
  assertEq(await r.result, sigOf(2), "dApp's result of the request made while the wallet slept");
  log("dapp", "got the answer of the woken wallet");
}

async function scenarioReconnect(version) {
  const dapp = await makeClient("dapp", SignClient, "2.25.0");
  const wallet = await makeClient("wallet", version === "2.17.1" ? SignClient2171 : SignClient, version);
  const topic = await makeSession(dapp, wallet);
  await roundTrip(dapp, wallet, topic, 1);

  begin(`the wallet goes offline; the dApp sends ${REQUESTS} requests`);
  await within(wallet.client.core.relayer.transportClose(), 10000, "wallet transportClose()");
  await sleep(500);
  const sent = [];
  const before = published.length;
  for (let n = 2; n < 2 + REQUESTS; n++) {
    const ack = publishAcked(1108);
    sent.push(sendRequest(dapp, topic, n));
    await ack;
  }
  const byMessage = new Map(sent.map((r) => [r.message, r.n]));
  const offlineMessages = published.slice(before).filter((p) => p.client === dapp.id && p.tag === 1108);
  assertEq(offlineMessages.length, REQUESTS, "the dApp's acknowledged request publishes");
  const from = deliveries.length;

  begin(`the wallet comes back (transportOpen, sign-client ${version})`);
  await within(wallet.client.core.relayer.transportOpen(), 30000, "wallet transportOpen()");
  const seen = new Set();
  for (let i = 0; i < REQUESTS; i++) {
    const ev = await answerNext(wallet, topic, byMessage);
    assert(!seen.has(ev.id), `request ${ev.id} came twice`);
    seen.add(ev.id);
  }
  for (const r of sent) assertEq(await r.result, sigOf(r.n), `dApp's result of request #${r.n}`);
  await sleep(1000); // a duplicate would be here by now
  assertEq(wallet.queues.get("session_request")?.length ?? 0, 0, "session_request events after the answers");
  const toWallet = deliveries.slice(from).filter((d) => d.client === wallet.id);
  for (const p of offlineMessages) {
    const got = toWallet.filter((d) => d.message === p.message).map((d) => d.via);
    assertEq(got.length, 1, `deliveries of one offline request to the wallet (${JSON.stringify(got)})`);
  }
  log("test", `each of the ${REQUESTS} requests reached the wallet once: ${toWallet.map((d) => `${d.via}:${d.tag}`).join(" ")}`);
}

const SCENARIOS = {
  push: scenarioPush,
  "reconnect-2.25.0": () => scenarioReconnect("2.25.0"),
  "reconnect-2.17.1": () => scenarioReconnect("2.17.1"),
};

async function main() {
  const run = SCENARIOS[SCENARIO];
  if (!run) throw new Error(`unknown SCENARIO ${SCENARIO} (one of ${Object.keys(SCENARIOS)})`);
  assert(RELAY_URL, "RELAY_URL is not set");
  log("test", `scenario ${SCENARIO}, relay ${RELAY_URL}, push server ${PUSH_URL || "none"}, always_raw ${ALWAYS_RAW}`);
  await run();
  begin("checks after the scenario");
  const outside = fetched.filter((u) => !/^https?:\/\/(127\.0\.0\.1|localhost|\[::1\])[:/]/.test(u));
  assertEq(outside, [], "URLs fetched outside loopback (besides the routed registration)");
  await cleanup();
  clearTimeout(overall);
  log("test", `PASS ${SCENARIO}`);
}

main().then(
  () => process.exit(0),
  (e) => fail(e?.stack ?? String(e)),
);
