#!/usr/bin/env node
// End-to-end test of the WalletConnect 1.0 bridge frames with the real 1.0 client,
// @walletconnect/client 1.8.0 (the last 1.x release), used unchanged, with walletrelay as the
// bridge:
//
//   BRIDGE_URL=ws://127.0.0.1:PORT node session.mjs
//   BRIDGE_URL=ws://127.0.0.1:P1,ws://127.0.0.1:P2,ws://127.0.0.1:P3 node session.mjs
//
// With several URLs (nodes of one cluster, DECISIONS §7) the dApp uses the first, the wallet
// the second (its URI's bridge rewritten to it) and the returning wallet the third: the
// pending request of step 5 is kept in Redis by node 1 and taken by node 3.
//
//   1. The dApp creates a session (`createSession`: a `wc_sessionRequest` published on a fresh
//      handshake topic while nobody listens there, so the bridge keeps it pending) and shows
//      its `uri`.
//   2. The wallet connects with the URI (it subscribes to the handshake topic and gets the
//      pending request), approves with an account; the dApp sees `connect` with that account.
//   3. The dApp sends personal_sign request #1; the wallet answers; the dApp gets the answer.
//   4. The wallet goes offline: its socket closed through the library (`transportClose`);
//      the script waits until the bridge has dropped the wallet's subscriptions (/metrics).
//   5. The dApp sends personal_sign request #2 while no wallet is connected: the bridge keeps
//      it pending.
//   6. The wallet comes back (a new connector restored from the saved session, as a wallet app
//      does after a restart: a new socket, a `sub` on its client id), gets request #2, answers
//      it, and the dApp gets the answer.
//   7. The dApp kills the session; the wallet sees `disconnect`.
//
// Exit status 0 on success; otherwise non-zero with the reason on stderr, also after the
// overall timeout (E2E_TIMEOUT_MS, default 60000).

import { createHash } from "node:crypto";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const WalletConnect = require("@walletconnect/client").default;

const BRIDGES = (process.env.BRIDGE_URL || "").split(",").map((u) => u.trim()).filter(Boolean);
const BRIDGE_URL = BRIDGES[0];
const WALLET_BRIDGE = BRIDGES[1] || BRIDGE_URL;
const BACK_BRIDGE = BRIDGES[2] || WALLET_BRIDGE;
const CLUSTER = BRIDGES.length > 1;
const TIMEOUT_MS = Number(process.env.E2E_TIMEOUT_MS || 60000);
const T0 = Date.now();

const CHAIN_ID = 1;
const ADDRESS = "0x8fd379246834eac74b8419ffda202cf8051f7a03";
const DAPP_META = {
  name: "walletrelay e2e dApp (v1)",
  description: "dApp side of the walletrelay WalletConnect 1.0 test",
  url: "https://dapp.example.org",
  icons: ["https://dapp.example.org/icon.png"],
};
const WALLET_META = {
  name: "walletrelay e2e wallet (v1)",
  description: "Wallet side of the walletrelay WalletConnect 1.0 test",
  url: "https://wallet.example.org",
  icons: ["https://wallet.example.org/icon.png"],
};

function log(who, msg) {
  const t = ((Date.now() - T0) / 1000).toFixed(3).padStart(7);
  console.log(`[${t}s] ${who.padEnd(7)} ${msg}`);
}

function fail(msg) {
  console.error(`FAIL: ${msg}`);
  process.exit(1);
}

// A stand-in for an ECDSA signature: 65 bytes, deterministic in (message, address), so the
// dApp can check that the answer it got is the answer to the request it sent.
function fakeSignature(message, address) {
  const h = createHash("sha512").update(`${message}|${address}`).digest("hex");
  return "0x" + h + h.slice(0, 2);
}

function toHex(text) {
  return "0x" + Buffer.from(text, "utf8").toString("hex");
}

// Resolves with the first call of `event` on `connector`: [error, payload].
function once(connector, event) {
  return new Promise((resolve) => connector.on(event, (error, payload) => resolve([error, payload])));
}

function within(ms, what, promise) {
  return Promise.race([
    promise,
    new Promise((_, reject) => setTimeout(() => reject(new Error(`timeout: ${what}`)), ms)),
  ]);
}

// A per-worker (or per-shard) series of a bridge (`walletrelay_<name>`), summed.
async function gauge(name, bridge = BRIDGE_URL) {
  const url = bridge.replace(/^ws/, "http").replace(/\/?$/, "/metrics");
  const text = await (await fetch(url)).text();
  return text
    .split("\n")
    .filter((l) => l.startsWith(`walletrelay_${name}{`))
    .reduce((sum, l) => sum + Number(l.split(" ").pop()), 0);
}

// Polls the gauge until `ok` holds (10 s at most); returns its value.
async function waitForGauge(name, ok, expected, bridge = BRIDGE_URL) {
  const end = Date.now() + 10000;
  for (;;) {
    const n = await gauge(name, bridge);
    if (ok(n)) return n;
    if (Date.now() > end) fail(`the bridge's ${name} is ${n}, expected ${expected}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

// The wallet's side: answers every personal_sign with the fake signature.
function answerCalls(wallet, who, seen) {
  wallet.on("call_request", (error, payload) => {
    if (error) fail(`${who}: call_request error ${error}`);
    log(who, `call_request #${payload.id} ${payload.method}`);
    if (payload.method !== "personal_sign") fail(`${who}: unexpected method ${payload.method}`);
    const [message, address] = payload.params;
    seen.push(message);
    wallet.approveRequest({ id: payload.id, result: fakeSignature(message, address) });
  });
}

async function sign(dapp, text) {
  const message = toHex(text);
  log("dapp", `personal_sign "${text}"`);
  const result = await within(20000, `answer to "${text}"`, dapp.signPersonalMessage([message, ADDRESS]));
  if (result !== fakeSignature(message, ADDRESS)) fail(`wrong answer to "${text}": ${result}`);
  log("dapp", `answer to "${text}" ok`);
  return message;
}

async function main() {
  if (!BRIDGE_URL) fail("BRIDGE_URL is not set");

  // 1. The dApp creates a session.
  const dapp = new WalletConnect({ bridge: BRIDGE_URL, clientMeta: DAPP_META });
  const connected = once(dapp, "connect");
  await dapp.createSession();
  log("dapp", `session created, uri ${dapp.uri.slice(0, 40)}..`);
  if (!dapp.uri.includes(encodeURIComponent(BRIDGE_URL))) fail(`the uri names another bridge: ${dapp.uri}`);

  // 2. The wallet connects with the URI and approves.
  const walletUri = dapp.uri.replace(encodeURIComponent(BRIDGE_URL), encodeURIComponent(WALLET_BRIDGE));
  const wallet = new WalletConnect({ uri: walletUri, clientMeta: WALLET_META });
  const [reqError, proposal] = await within(20000, "session_request", once(wallet, "session_request"));
  if (reqError) fail(`session_request error ${reqError}`);
  const peer = proposal.params[0].peerMeta;
  log("wallet", `session_request from "${peer && peer.name}"`);
  if (!peer || peer.name !== DAPP_META.name) fail(`unexpected peer ${JSON.stringify(peer)}`);
  const seen = [];
  answerCalls(wallet, "wallet", seen);
  wallet.approveSession({ accounts: [ADDRESS], chainId: CHAIN_ID });
  const [connError, conn] = await within(20000, "connect", connected);
  if (connError) fail(`connect error ${connError}`);
  const accounts = conn.params[0].accounts;
  log("dapp", `connected: ${accounts.join(",")} on chain ${conn.params[0].chainId}`);
  if (accounts[0] !== ADDRESS) fail(`unexpected accounts ${accounts}`);

  // 3. A request and its answer.
  const first = await sign(dapp, "walletrelay e2e v1: request 1");
  if (seen[0] !== first) fail(`the wallet saw ${seen}`);

  // 4. The wallet goes offline.
  const session = wallet.session;
  const before = await gauge("subscriptions", WALLET_BRIDGE);
  wallet.transportClose();
  const after = await waitForGauge("subscriptions", (n) => n < before, `< ${before}`, WALLET_BRIDGE);
  log("wallet", `offline (bridge subscriptions ${before} -> ${after})`);

  // 5. A request while the wallet is offline: the bridge keeps it.
  const published = await gauge("messages_published_total");
  const second = sign(dapp, "walletrelay e2e v1: request 2 (wallet offline)");
  if (CLUSTER) {
    // Pending in Redis: the dApp's node handed the pub on and Redis answered it.
    await waitForGauge("messages_published_total", (n) => n > published, `> ${published}`);
    await waitForGauge("redis_queued", (n) => n === 0, "0");
    await waitForGauge("redis_in_flight", (n) => n === 0, "0");
  } else {
    await waitForGauge("cached_messages", (n) => n === 1, "1 (the request, pending)");
  }
  log("dapp", "request 2 is pending on the bridge");

  // 6. The wallet comes back with its saved session.
  const back = new WalletConnect({ session: { ...session, bridge: BACK_BRIDGE }, clientMeta: WALLET_META });
  const seenBack = [];
  answerCalls(back, "wallet'", seenBack);
  const disconnected = once(back, "disconnect");
  log("wallet'", "back online (restored session)");
  const secondMessage = await second;
  if (seenBack.length !== 1 || seenBack[0] !== secondMessage) fail(`the returning wallet saw ${seenBack}`);

  // 7. The dApp kills the session.
  await dapp.killSession();
  log("dapp", "killSession");
  const [discError, disc] = await within(20000, "disconnect", disconnected);
  if (discError) fail(`disconnect error ${discError}`);
  log("wallet'", `disconnect: ${disc.params[0].message}`);
  if (back.connected) fail("the wallet still thinks it is connected");

  dapp.transportClose();
  back.transportClose();
  log("done", "ok");
}

setTimeout(() => fail(`overall timeout ${TIMEOUT_MS} ms`), TIMEOUT_MS).unref();
main().then(
  () => process.exit(0),
  (e) => fail(e && e.stack ? e.stack : String(e)),
);
