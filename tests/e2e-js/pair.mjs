#!/usr/bin/env node
// End-to-end test of a waku relay with the real WalletConnect client, @walletconnect/client
// 2.0.0-beta.19 (the last generation that speaks waku_subscribe / waku_publish), used unchanged.
//
//   RELAY_URL=ws://127.0.0.1:PORT node pair.mjs
//   RELAY_URL=ws://127.0.0.1:P1,ws://127.0.0.1:P2[,ws://127.0.0.1:P3] node pair.mjs
//
// With several URLs (nodes of one cluster), the dApp uses the first, the wallet the second, and
// the wallet that comes back (step 5) the third (the second again if there is no third).
//
// The dApp runs in this process. The wallet runs in a child process (this same file, started as
// `pair.mjs wallet N STORAGE_FILE`) so that it can go away for real and come back later:
//
//   1. dApp `connect`s (permissions: chain eip155:1, method personal_sign); the wallet `pair`s
//      with the URI and approves the session proposal with an account; the session settles.
//   2. dApp sends personal_sign request #1; the wallet answers; the dApp receives the answer.
//   3. The wallet closes its WebSocket through the client library (which closes without a status
//      code) and its process exits, so it has no connection to the relay at all.
//   4. dApp sends personal_sign request #2; the relay accepts the publish while no wallet is
//      connected.
//   5. A new wallet process restores pairing, session, keys, history and subscriptions from the
//      same storage file, resubscribes, gets request #2 from the relay's cache, answers it, and
//      the dApp receives the answer.
//
// Exit status 0 on success; otherwise non-zero with the reason on stderr, also after the overall
// timeout (E2E_TIMEOUT_MS, default 60000). WC_LOG_LEVEL=debug|trace shows the client's own logs.

import { fork } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
const {
  Client,
  CLIENT_EVENTS,
  SESSION_EVENTS,
  HISTORY_EVENTS,
} = require("@walletconnect/client");

const SELF = fileURLToPath(import.meta.url);
// The relays, in the order of the roles above: the first is this process's own.
const RELAY_URLS = (process.env.RELAY_URL || "").split(",").map((u) => u.trim()).filter(Boolean);
const RELAY_URL = RELAY_URLS[0];
const LOG_LEVEL = process.env.WC_LOG_LEVEL || "silent";
const TIMEOUT_MS = Number(process.env.E2E_TIMEOUT_MS || 60000);
const T0 = Number(process.env.E2E_T0 || Date.now());

const CHAIN = "eip155:1";
const METHOD = "personal_sign";
const ADDRESS = "0x8fd379246834eac74b8419ffda202cf8051f7a03";
const ACCOUNT = `${CHAIN}:${ADDRESS}`;
const DAPP_METADATA = {
  name: "walletrelay e2e dApp",
  description: "dApp side of the walletrelay end-to-end test",
  url: "https://dapp.example.org",
  icons: ["https://dapp.example.org/icon.png"],
};
const WALLET_METADATA = {
  name: "walletrelay e2e wallet",
  description: "Wallet side of the walletrelay end-to-end test",
  url: "https://wallet.example.org",
  icons: ["https://wallet.example.org/icon.png"],
};

// ---------------------------------------------------------------------------------------------
// Helpers shared by both roles

function log(who, msg) {
  const t = ((Date.now() - T0) / 1000).toFixed(3).padStart(7);
  console.log(`[${t}s] ${who.padEnd(8)} ${msg}`);
}

function short(hex) {
  return typeof hex === "string" && hex.length > 16 ? `${hex.slice(0, 8)}..${hex.slice(-4)}` : String(hex);
}

function toHex(text) {
  return "0x" + Buffer.from(text, "utf8").toString("hex");
}

// A stand-in for an ECDSA signature: 65 bytes, deterministic in (message, address), so the dApp
// can check that the answer it got is the answer to the request it sent.
function fakeSign(messageHex, address) {
  const h = (s) => createHash("sha256").update(s).digest("hex");
  return "0x" + h(`${messageHex}|${address}|r`) + h(`${messageHex}|${address}|s`) + "1b";
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// The client's storage option (IKeyValueStorage of keyvaluestorage-interface): values are kept as
// JSON text like keyvaluestorage does, in memory, and if `file` is given also written through to
// that file on every change so that a later process can restore from it.
class JsonKeyValueStorage {
  constructor(file) {
    this.file = file;
    this.map = new Map();
    if (file && fs.existsSync(file)) {
      for (const [k, v] of Object.entries(JSON.parse(fs.readFileSync(file, "utf8")))) {
        this.map.set(k, v);
      }
    }
  }
  async getKeys() {
    return [...this.map.keys()];
  }
  async getEntries() {
    return [...this.map].map(([k, v]) => [k, JSON.parse(v)]);
  }
  async getItem(key) {
    const v = this.map.get(key);
    return v === undefined ? undefined : JSON.parse(v);
  }
  async setItem(key, value) {
    if (value === undefined) this.map.delete(key);
    else this.map.set(key, JSON.stringify(value));
    this.flush();
  }
  async removeItem(key) {
    this.map.delete(key);
    this.flush();
  }
  flush() {
    if (!this.file) return;
    const tmp = `${this.file}.tmp`;
    fs.writeFileSync(tmp, JSON.stringify(Object.fromEntries(this.map)));
    fs.renameSync(tmp, this.file);
  }
}

function checkRelayUrl() {
  if (!RELAY_URLS.length || !RELAY_URLS.every((u) => /^wss?:\/\/[^/]+/.test(u))) {
    console.error("FAIL: set RELAY_URL to the relay's WebSocket address, e.g. ws://127.0.0.1:8080 " +
      "(or a comma-separated list of nodes: dApp, wallet, returning wallet)");
    process.exit(2);
  }
}

// The relay the wallet's incarnation N (1, 2) talks to.
function walletRelayUrl(incarnation) {
  return RELAY_URLS[Math.min(incarnation, RELAY_URLS.length - 1)];
}

// ---------------------------------------------------------------------------------------------
// Wallet role (child process)

async function walletMain(incarnation, storageFile) {
  const who = `wallet#${incarnation}`;
  const send = (msg) => process.send(msg);
  const failChild = (e) => {
    const message = e && e.stack ? e.stack : String(e);
    process.send({ type: "error", message: `${who}: ${message}` }, () => process.exit(1));
  };
  process.on("disconnect", () => process.exit(3)); // the parent went away
  process.on("uncaughtException", failChild);
  process.on("unhandledRejection", (e) => log(who, `warning: unhandled rejection in client: ${e}`));

  const storage = new JsonKeyValueStorage(storageFile);
  const restoredKeys = (await storage.getKeys()).length;
  log(who, restoredKeys
    ? `Client.init, restoring ${restoredKeys} storage keys from ${path.basename(storageFile)}`
    : "Client.init with empty storage");
  const client = new Client({
    relayProvider: RELAY_URL,
    controller: true,
    metadata: WALLET_METADATA,
    storage,
    logger: LOG_LEVEL,
  });

  // Requests are taken from the session controller's own event, subscribed before initialize():
  // a restored wallet receives cached requests while initialize() is still resubscribing, before
  // the client re-emits session events at its own level.
  const seen = new Set();
  client.session.on(SESSION_EVENTS.request, async ({ topic, request, chainId }) => {
    try {
      if (seen.has(request.id)) return;
      seen.add(request.id);
      log(who, `received ${request.method} request id=${request.id} chain=${chainId} on session ${short(topic)}`);
      send({ type: "request", id: request.id, method: request.method, params: request.params, chainId, topic });
      if (request.method !== METHOD) throw new Error(`unexpected method ${request.method}`);
      const [messageHex, address] = request.params;
      const result = fakeSign(messageHex, address);
      await client.respond({ topic, response: { id: request.id, jsonrpc: "2.0", result } });
      log(who, `answered request id=${request.id} with ${short(result)}`);
      send({ type: "answered", id: request.id, result });
    } catch (e) {
      failChild(e);
    }
  });

  client.on(CLIENT_EVENTS.session.proposal, async (proposal) => {
    try {
      const chains = proposal.permissions.blockchain.chains;
      const methods = proposal.permissions.jsonrpc.methods;
      log(who, `session proposal from "${proposal.proposer.metadata?.name}": chains=${chains} methods=${methods}`);
      if (!chains.includes(CHAIN) || !methods.includes(METHOD)) {
        throw new Error(`proposal lacks ${CHAIN} / ${METHOD}`);
      }
      const session = await client.approve({
        proposal,
        response: { state: { accounts: [ACCOUNT] }, metadata: WALLET_METADATA },
      });
      log(who, `approved; session ${short(session.topic)} settled on the wallet side`);
      send({ type: "approved", topic: session.topic });
    } catch (e) {
      failChild(e);
    }
  });

  process.on("message", async (msg) => {
    try {
      if (msg.type === "pair") {
        log(who, "pairing with the URI");
        const pairing = await client.pair({ uri: msg.uri });
        log(who, `pairing ${short(pairing.topic)} settled`);
        send({ type: "paired", topic: pairing.topic });
      } else if (msg.type === "offline") {
        // Close the transport the way the client library does it (socket.close() with no status
        // code), wait for the relay to finish the close handshake, and quit. The library starts
        // reconnecting right away (its RELAYER_RECONNECT_TIMEOUT of 1 "second" is handed to
        // setTimeout as 1 ms); that attempt dies with this process, before the dApp sends anything.
        const ws = client.relayer.provider.connection.socket;
        const closed = new Promise((resolve) =>
          ws.addEventListener("close", (event) => resolve(event.code), { once: true }));
        await client.relayer.provider.disconnect();
        const code = await Promise.race([closed, sleep(2000).then(() => null)]);
        log(who, code === null
          ? "WebSocket close sent; the relay did not finish the close handshake within 2 s, quitting anyway"
          : `WebSocket closed by the library (close code seen by the client: ${code}); quitting`);
        process.send({ type: "offline", closeCode: code }, () => process.exit(0));
      } else if (msg.type === "exit") {
        process.exit(0);
      }
    } catch (e) {
      failChild(e);
    }
  });

  await client.initialize();
  log(who, `initialized: ${client.pairing.topics.length} pairing(s), ${client.session.topics.length} session(s), ` +
    `${client.relayer.subscriptions.topics.length} subscribed topic(s)`);
  send({
    type: "ready",
    pairings: client.pairing.topics,
    sessions: client.session.topics,
    subscriptions: client.relayer.subscriptions.topics,
  });
}

// ---------------------------------------------------------------------------------------------
// dApp role (main process) and the scenario

let currentStep = "starting";
let tmpDir;
const children = new Set();

function step(who, msg) {
  currentStep = `${who} ${msg}`;
  log(who, msg);
}

function cleanup() {
  for (const child of children) child.kill("SIGKILL");
  if (tmpDir) fs.rmSync(tmpDir, { recursive: true, force: true });
}

function fail(reason) {
  console.error(`FAIL: ${reason}`);
  console.error(`      (at step: ${currentStep})`);
  cleanup();
  process.exit(1);
}

function check(cond, what) {
  if (!cond) fail(what);
}

function startWallet(incarnation, storageFile) {
  const who = `wallet#${incarnation}`;
  const relay = walletRelayUrl(incarnation);
  log(who, `relay ${relay}`);
  const child = fork(SELF, ["wallet", String(incarnation), storageFile], {
    env: { ...process.env, E2E_T0: String(T0), RELAY_URL: relay },
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
  children.add(child);
  const queue = [];
  const waiters = [];
  let expectExit = false;
  child.on("message", (msg) => {
    if (msg.type === "error") fail(msg.message);
    const i = waiters.findIndex((w) => w.type === msg.type);
    if (i >= 0) waiters.splice(i, 1)[0].resolve(msg);
    else queue.push(msg);
  });
  const exited = new Promise((resolve) => {
    child.on("exit", (code, signal) => {
      children.delete(child);
      if (!expectExit) fail(`${who} process exited unexpectedly (code ${code}, signal ${signal})`);
      resolve(code);
    });
  });
  return {
    send: (msg) => child.send(msg),
    waitFor(type) {
      const i = queue.findIndex((m) => m.type === type);
      if (i >= 0) return Promise.resolve(queue.splice(i, 1)[0]);
      return new Promise((resolve) => waiters.push({ type, resolve }));
    },
    queued: () => queue,
    async stop(msg) {
      expectExit = true;
      if (msg) child.send(msg);
      return exited;
    },
    expectExit() {
      expectExit = true;
      return exited;
    },
  };
}

async function dappMain() {
  checkRelayUrl();
  setTimeout(() => fail(`overall timeout of ${TIMEOUT_MS} ms`), TIMEOUT_MS);
  process.on("uncaughtException", (e) => fail(`uncaught exception: ${e && e.stack ? e.stack : e}`));
  process.on("unhandledRejection", (e) => log("dapp", `warning: unhandled rejection in client: ${e}`));
  tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), "walletrelay-e2e-"));
  const walletStorage = path.join(tmpDir, "wallet-storage.json");

  step("dapp", `Client.init, relay ${RELAY_URL}`);
  const dapp = await Client.init({
    relayProvider: RELAY_URL,
    controller: false,
    metadata: DAPP_METADATA,
    storage: new JsonKeyValueStorage(null),
    logger: LOG_LEVEL,
  });

  step("wallet#1", "starting the wallet process");
  const w1 = startWallet(1, walletStorage);
  await w1.waitFor("ready");

  // --- pairing and session -------------------------------------------------------------------
  step("dapp", `connect: permissions chains=[${CHAIN}] methods=[${METHOD}]`);
  const uriPromise = new Promise((resolve) =>
    dapp.once(CLIENT_EVENTS.pairing.proposal, (proposal) => resolve(proposal.signal.params.uri)));
  const connectPromise = dapp.connect({
    permissions: { blockchain: { chains: [CHAIN] }, jsonrpc: { methods: [METHOD] } },
  });
  connectPromise.catch((e) => fail(`dApp connect failed: ${e && e.message ? e.message : e}`));
  const uri = await uriPromise;
  log("dapp", `pairing URI ${uri.slice(0, 60)}...`);

  step("wallet#1", "pair with the URI");
  w1.send({ type: "pair", uri });
  const paired = await w1.waitFor("paired");

  step("dapp", "waiting for the session to settle");
  const approved = await w1.waitFor("approved");
  const session = await connectPromise;
  log("dapp", `session ${short(session.topic)} settled on the dApp side; accounts=${session.state.accounts}`);
  check(session.topic === approved.topic,
    `session topics differ: dApp ${session.topic}, wallet ${approved.topic}`);
  check(/^[0-9a-f]{64}$/.test(session.topic) && /^[0-9a-f]{64}$/.test(paired.topic),
    `topics are not 64 lowercase hex: session ${session.topic}, pairing ${paired.topic}`);
  check(session.state.accounts.length === 1 && session.state.accounts[0] === ACCOUNT,
    `unexpected session accounts ${JSON.stringify(session.state.accounts)}`);
  check(session.permissions.jsonrpc.methods.includes(METHOD) &&
    session.permissions.blockchain.chains.includes(CHAIN),
    `unexpected session permissions ${JSON.stringify(session.permissions)}`);

  const sendRequest = (text) => {
    const messageHex = toHex(text);
    const promise = dapp.request({
      topic: session.topic,
      chainId: CHAIN,
      request: { method: METHOD, params: [messageHex, ADDRESS] },
    });
    return { messageHex, promise };
  };

  // --- request #1, wallet online ---------------------------------------------------------------
  step("dapp", "sending personal_sign request #1 (wallet online)");
  const r1 = sendRequest("walletrelay e2e: request #1, wallet online");
  const result1 = await r1.promise;
  const answered1 = await w1.waitFor("answered");
  log("dapp", `received the answer to request #1: ${short(result1)}`);
  check(result1 === fakeSign(r1.messageHex, ADDRESS), `wrong answer to request #1: ${result1}`);
  check(answered1.result === result1, "the wallet's answer #1 and the dApp's result differ");

  // --- wallet offline ---------------------------------------------------------------------------
  step("wallet#1", "going offline: closing its WebSocket and quitting");
  const w1Exit = w1.expectExit();
  w1.send({ type: "offline" });
  await w1.waitFor("offline");
  check((await w1Exit) === 0, "wallet#1 did not exit cleanly");
  log("wallet#1", "process gone; the wallet has no connection to the relay");

  // --- request #2 while the wallet is offline ---------------------------------------------------
  step("dapp", "sending personal_sign request #2 while the wallet is offline");
  const text2 = "walletrelay e2e: request #2, sent while the wallet is offline";
  // The dApp client records a request in its history only after the relay answered its
  // waku_publish, so this event means the relay has accepted (and must have cached) it.
  const published2 = new Promise((resolve) =>
    dapp.session.history.on(HISTORY_EVENTS.created, (record) => {
      if (record.topic === session.topic && record.request.method === METHOD &&
        record.request.params[0] === toHex(text2)) resolve(record);
    }));
  const r2 = sendRequest(text2);
  r2.promise.catch((e) => fail(`request #2 failed: ${e && e.message ? e.message : e}`));
  const record2 = await published2;
  log("dapp", `relay accepted the publish of request #2 (id=${record2.id}) with no wallet connected`);

  // --- wallet back: new process restored from storage ------------------------------------------
  step("wallet#2", "starting a new wallet process restored from the same storage");
  const w2 = startWallet(2, walletStorage);
  const ready2 = await w2.waitFor("ready");
  check(ready2.sessions.includes(session.topic),
    `restored wallet does not know session ${session.topic}: sessions ${JSON.stringify(ready2.sessions)}`);
  check(ready2.subscriptions.includes(session.topic),
    `restored wallet is not subscribed to the session topic: ${JSON.stringify(ready2.subscriptions)}`);

  step("wallet#2", "waiting for request #2 from the relay's cache");
  const request2 = await w2.waitFor("request");
  check(request2.id === record2.id,
    `restored wallet got request id=${request2.id} first, expected request #2 id=${record2.id} ` +
    "(an already answered request was delivered as new, or request #2 is missing)");
  await w2.waitFor("answered");

  step("dapp", "waiting for the answer to request #2");
  const result2 = await r2.promise;
  log("dapp", `received the answer to request #2: ${short(result2)}`);
  check(result2 === fakeSign(r2.messageHex, ADDRESS), `wrong answer to request #2: ${result2}`);
  check(!w2.queued().some((m) => m.type === "request"),
    `restored wallet got more requests: ${JSON.stringify(w2.queued())}`);

  step("wallet#2", "stopping");
  await w2.stop({ type: "exit" });
  cleanup();
  log("dapp", "PASS: pairing, session, request/response, and cached delivery to a returning wallet");
  process.exit(0);
}

// ---------------------------------------------------------------------------------------------

if (process.argv[2] === "wallet") {
  checkRelayUrl();
  walletMain(Number(process.argv[3]), process.argv[4]).catch((e) => {
    process.send({ type: "error", message: `wallet#${process.argv[3]}: ${e && e.stack ? e.stack : e}` },
      () => process.exit(1));
  });
} else {
  dappMain().catch((e) => fail(e && e.stack ? e.stack : String(e)));
}
