#!/usr/bin/env node
// The example dApp (examples/dapp, already built: dist/app.js) in headless Chromium against
// walletrelay, paired with a wallet made with @walletconnect/sign-client 2.25.0 in this Node
// process. Run by tests/browser.rs:
//
//   RELAY_URL=ws://127.0.0.1:PORT CHROMIUM=/usr/bin/chromium PAGE_DIR=.../examples/dapp \
//   SCREENSHOT=.../target/browser-ws.png node browser.mjs
//
// 1. Serves PAGE_DIR on a loopback port (a small static server in this process).
// 2. Starts Chromium (puppeteer-core, headless, --no-sandbox as root) with every request the
//    page makes outside loopback aborted and listed (request interception), and, behind that,
//    a host resolver that resolves nothing but localhost. HOME is CHROME_HOME when set (the
//    wss:// run puts an NSS database that trusts the test CA there).
// 3. Loads the page with ?relay=RELAY_URL; reads the pairing URI from its text and from its
//    QR code (the canvas pixels decoded with jsQR): both must agree.
// 4. The wallet pairs with that URI and approves one account; the page must show it.
// 5. Clicks the page's "sign" button; the wallet gets personal_sign with the message the page
//    shows (hex) and the account, and answers a random signature; the page must show exactly
//    that answer.
// 6. The page's relay connection must be the browser's own WebSocket (seen by DevTools and as
//    `instanceof WebSocket` in the page) to RELAY_URL, answered 101; its negotiated extensions
//    (the 101's Sec-WebSocket-Extensions and `WebSocket.extensions` in the page) must contain
//    permessage-deflate when EXPECT_DEFLATE=1, and be empty otherwise.
// 7. With TRUST_CHECK_URL (an https:// URL on the relay's TLS listener): this browser loads it,
//    and a second browser with an empty HOME must refuse its certificate.
// 8. Screenshots: the page with the answer to SCREENSHOT, and with the QR code to
//    SCREENSHOT with "-pairing" before ".png".
//
// Output lines the Rust test reads: "WALLET_SENT <sig>", "PAGE_SHOWS <text>",
// "WS <url> status=<n> extensions=<value>", "BLOCKED <url>", "DONE".
// Node itself reaches nothing outside loopback either: globalThis.fetch is a recorder that
// throws (the script fails if anything was fetched), and IS_VITEST=true is set before the SDK
// is imported (the SDK then skips its verify calls), as tests/e2e-sdk/sdk.mjs does.
//
// Exit status 0 on success; 1 with "FAIL: <reason>" on stderr otherwise (also on the timeout).

import http from "node:http";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import crypto from "node:crypto";
import { offline, within } from "../e2e-common/offline.mjs";

const RELAY_URL = need("RELAY_URL");
const CHROMIUM = need("CHROMIUM");
const PAGE_DIR = path.resolve(need("PAGE_DIR"));
const SCREENSHOT = need("SCREENSHOT");
const EXPECT_DEFLATE = process.env.EXPECT_DEFLATE === "1";
const CHROME_HOME = process.env.CHROME_HOME || "";
const TRUST_CHECK_URL = process.env.TRUST_CHECK_URL || "";
const TIMEOUT_MS = Number(process.env.E2E_TIMEOUT_MS || 60000);
const T0 = Date.now();

const ADDRESS = "0x" + crypto.randomBytes(20).toString("hex");
const ACCOUNT = `eip155:1:${ADDRESS}`;
const SIGNATURE = "0x" + crypto.randomBytes(65).toString("hex");

function need(name) {
  const v = process.env[name];
  if (!v) {
    console.error(`FAIL: ${name} is not set`);
    process.exit(1);
  }
  return v;
}

function log(who, msg) {
  const t = ((Date.now() - T0) / 1000).toFixed(3).padStart(7);
  console.log(`[${t}s] ${who.padEnd(7)} ${msg}`);
}

function assert(cond, msg) {
  if (!cond) throw new Error(`assertion failed: ${msg}`);
}


// ---------------------------------------------------------------------------------------------
// Node reaches nothing outside loopback

const { fetched, unhandled } = offline(log);

const { SignClient } = await import("@walletconnect/sign-client");
const { default: puppeteer } = await import("puppeteer-core");
const { default: jsQR } = await import("jsqr");

const LOOPBACK = new Set(["127.0.0.1", "localhost", "[::1]", "::1"]);
function isLoopback(url) {
  try {
    const u = new URL(url);
    if (u.protocol === "data:" || u.protocol === "blob:" || u.protocol === "about:") return true;
    return LOOPBACK.has(u.hostname);
  } catch {
    return false;
  }
}

// ---------------------------------------------------------------------------------------------
// The static server for the page

const TYPES = { ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".png": "image/png" };
function serve() {
  const server = http.createServer((req, res) => {
    const rel = decodeURIComponent(new URL(req.url, "http://x").pathname);
    const file = path.join(PAGE_DIR, rel === "/" ? "index.html" : rel);
    if (!file.startsWith(PAGE_DIR + path.sep) || !fs.existsSync(file) || !fs.statSync(file).isFile()) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { "content-type": TYPES[path.extname(file)] || "application/octet-stream" });
    fs.createReadStream(file).pipe(res);
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(server)));
}

// ---------------------------------------------------------------------------------------------
// The browser

const isRoot = typeof process.getuid === "function" && process.getuid() === 0;
function launch(home) {
  return puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    pipe: true,
    env: { ...process.env, HOME: home },
    args: [
      ...(isRoot ? ["--no-sandbox"] : []),
      "--disable-dev-shm-usage",
      "--disable-gpu",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--disable-domain-reliability",
      // Behind the request interception: nothing but loopback resolves.
      "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
      "--window-size=900,600",
    ],
  });
}

const cleanups = [];
async function cleanup() {
  for (const f of cleanups.splice(0).reverse()) {
    try {
      await within(Promise.resolve().then(f), 5000, "cleanup");
    } catch {}
  }
}

async function fail(msg) {
  console.error(`FAIL: ${msg}`);
  console.error(`fetch calls recorded in Node: ${JSON.stringify(fetched)}`);
  console.error(`unhandled rejections: ${unhandled.length}`);
  await cleanup();
  process.exit(1);
}
const overall = setTimeout(() => fail(`overall timeout of ${TIMEOUT_MS} ms passed`), TIMEOUT_MS);

/** The text of element `#id` once `ok(text)` holds. */
async function waitText(page, id, ok, ms, what) {
  const end = Date.now() + ms;
  for (;;) {
    const { text, error } = await page.evaluate(
      (id) => ({
        text: document.getElementById(id)?.textContent ?? "",
        error: document.getElementById("error")?.textContent ?? "",
      }),
      id,
    );
    if (error) throw new Error(`the page shows an error: ${error}`);
    if (ok(text)) return text;
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms: ${what} (#${id} is "${text}")`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Checks the certificate trust of the wss:// run against TRUST_CHECK_URL. */
async function checkTrust(browser) {
  const page = await browser.newPage();
  const res = await page.goto(TRUST_CHECK_URL, { timeout: 15000 });
  assert(res && res.status() === 200, `the trusting browser loads ${TRUST_CHECK_URL}: ${res?.status()}`);
  await page.close();
  log("browser", `trusting browser (HOME with the test CA): ${TRUST_CHECK_URL} -> ${res.status()}`);
  const emptyHome = fs.mkdtempSync(path.join(os.tmpdir(), "walletrelay-nohome-"));
  const other = await launch(emptyHome);
  try {
    const p = await other.newPage();
    let error = "";
    try {
      await p.goto(TRUST_CHECK_URL, { timeout: 15000 });
    } catch (e) {
      error = e.message;
    }
    log("browser", `browser without the test CA: ${TRUST_CHECK_URL} -> ${error || "loaded"}`);
    assert(/ERR_CERT_AUTHORITY_INVALID/.test(error), `a browser without the test CA refuses ${TRUST_CHECK_URL}`);
  } finally {
    await other.close();
    fs.rmSync(emptyHome, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------------------------------------
// The run

async function main() {
  const server = await serve();
  cleanups.push(() => new Promise((r) => server.close(r)));
  const pageUrl = `http://127.0.0.1:${server.address().port}/?relay=${encodeURIComponent(RELAY_URL)}`;
  log("test", `page ${pageUrl}`);

  const home = CHROME_HOME || fs.mkdtempSync(path.join(os.tmpdir(), "walletrelay-chrome-"));
  if (!CHROME_HOME) cleanups.push(() => fs.rmSync(home, { recursive: true, force: true }));
  const browser = await launch(home);
  cleanups.push(() => browser.close());
  log("browser", `${await browser.version()} (puppeteer-core, HOME ${home})`);
  if (TRUST_CHECK_URL) await checkTrust(browser);

  const page = await browser.newPage();
  await page.setViewport({ width: 900, height: 600 });
  page.on("console", (m) => log("page", `console.${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => log("page", `pageerror: ${e.message}`));

  // Every request outside loopback is aborted and listed.
  const blocked = [];
  await page.setRequestInterception(true);
  page.on("request", (req) => {
    if (isLoopback(req.url())) return req.continue();
    blocked.push(req.url());
    log("blocked", req.url());
    return req.abort("blockedbyclient");
  });

  // The page's WebSockets as DevTools sees them: only the browser's own WebSocket shows here.
  const sockets = new Map();
  const cdp = await page.createCDPSession();
  await cdp.send("Network.enable");
  cdp.on("Network.webSocketCreated", (e) => sockets.set(e.requestId, { url: e.url }));
  cdp.on("Network.webSocketWillSendHandshakeRequest", (e) => {
    const s = sockets.get(e.requestId);
    if (s) s.offered = header(e.request.headers, "sec-websocket-extensions");
  });
  cdp.on("Network.webSocketHandshakeResponseReceived", (e) => {
    const s = sockets.get(e.requestId);
    if (s) {
      s.status = e.response.status;
      s.extensions = header(e.response.headers, "sec-websocket-extensions");
    }
  });

  await page.goto(pageUrl, { waitUntil: "load", timeout: 15000 });
  const uri = await waitText(page, "uri", (t) => t.startsWith("wc:"), 20000, "the pairing URI");
  log("page", `pairing URI (text) ${uri}`);
  const qr = await page.evaluate(() => {
    const c = document.getElementById("qr");
    const d = c.getContext("2d").getImageData(0, 0, c.width, c.height);
    return { width: c.width, height: c.height, data: Array.from(d.data) };
  });
  const decoded = jsQR(Uint8ClampedArray.from(qr.data), qr.width, qr.height);
  log("page", `pairing URI (QR ${qr.width}x${qr.height} px) ${decoded?.data}`);
  assert(decoded && decoded.data === uri, "the QR code holds the URI the page shows as text");
  const pairingShot = SCREENSHOT.replace(/\.png$/, "") + "-pairing.png";
  await page.screenshot({ path: pairingShot, fullPage: true });
  log("test", `screenshot ${pairingShot}`);

  // The wallet: sign-client in Node, on the same relay.
  const wallet = await SignClient.init({
    projectId: "walletrelay-browser-test",
    relayUrl: RELAY_URL,
    customStoragePrefix: `walletrelay-browser-wallet-${process.pid}`,
    logger: "error",
    telemetryEnabled: false,
    metadata: { name: "walletrelay test wallet", description: "Node wallet of the browser test", url: "http://127.0.0.1", icons: [] },
  });
  cleanups.push(async () => {
    wallet.core.heartbeat.stop();
    await wallet.core.relayer.transportClose();
  });
  const proposal = new Promise((r) => wallet.once("session_proposal", r));
  const request = new Promise((r) => wallet.once("session_request", r));
  await within(wallet.pair({ uri }), 20000, "wallet pair({uri})");
  const { id, params } = await within(proposal, 20000, "the session proposal");
  log("wallet", `proposal ${id} from ${params.proposer.metadata.name} (${params.proposer.metadata.url})`);
  const { acknowledged } = await wallet.approve({
    id,
    namespaces: {
      eip155: {
        chains: ["eip155:1"],
        accounts: [ACCOUNT],
        methods: ["personal_sign"],
        events: ["accountsChanged", "chainChanged"],
      },
    },
  });
  await within(acknowledged(), 20000, "the dApp acknowledging the session");
  const accounts = await waitText(page, "accounts", (t) => t.length > 0, 20000, "the session's accounts");
  log("page", `accounts ${accounts}`);
  assert(accounts === ACCOUNT, `the page shows the approved account ${ACCOUNT}`);

  // personal_sign: the page's button, the wallet's answer, the page shows it.
  const message = await waitText(page, "message", (t) => t.length > 0, 5000, "the message");
  await page.click("#sign");
  const req = await within(request, 20000, "the page's personal_sign request");
  const { method, params: signParams } = req.params.request;
  log("wallet", `request ${req.id}: ${method} ${JSON.stringify(signParams)}`);
  assert(method === "personal_sign", `method ${method}`);
  assert(signParams[0] === "0x" + Buffer.from(message, "utf8").toString("hex"), "params[0] is the page's message, hex");
  assert(signParams[1] === ADDRESS, "params[1] is the approved address");
  await wallet.respond({ topic: req.topic, response: { id: req.id, jsonrpc: "2.0", result: SIGNATURE } });
  console.log(`WALLET_SENT ${SIGNATURE}`);
  const shown = await waitText(page, "answer", (t) => t.length > 0, 20000, "the wallet's answer on the page");
  console.log(`PAGE_SHOWS ${shown}`);
  assert(shown === SIGNATURE, "the page shows the wallet's answer");
  await page.screenshot({ path: SCREENSHOT, fullPage: true });
  log("test", `screenshot ${SCREENSHOT}`);

  // The page's relay connection: the browser's own WebSocket, and what it negotiated.
  const inPage = await page.evaluate(() => {
    const s = window.walletrelayDapp?.client?.core?.relayer?.provider?.connection?.socket;
    return {
      native:
        !!s && s instanceof WebSocket && /\[native code\]/.test(Function.prototype.toString.call(WebSocket)),
      url: s?.url ?? "",
      extensions: s?.extensions ?? "",
      readyState: s?.readyState,
    };
  });
  log("page", `relay socket in the page: ${JSON.stringify(inPage)}`);
  assert(inPage.native, "the SDK in the page uses the browser's native WebSocket");
  assert(inPage.url.startsWith(RELAY_URL), `the page's socket goes to ${RELAY_URL}`);
  for (const s of sockets.values()) {
    console.log(`WS ${s.url.split("?")[0]} status=${s.status} offered=${s.offered ?? ""} extensions=${s.extensions ?? ""}`);
  }
  const relaySockets = [...sockets.values()].filter((s) => s.url.startsWith(RELAY_URL));
  assert(relaySockets.length >= 1, "DevTools saw the page's WebSocket to the relay");
  assert([...sockets.values()].every((s) => isLoopback(s.url)), "every WebSocket of the page is on loopback");
  for (const s of relaySockets) {
    assert(s.status === 101, `the relay answered the upgrade with 101 (${s.status})`);
    assert(/permessage-deflate/.test(s.offered ?? ""), "the browser offered permessage-deflate");
    const got = /permessage-deflate/.test(s.extensions ?? "");
    assert(got === EXPECT_DEFLATE, `permessage-deflate negotiated: ${got}, expected ${EXPECT_DEFLATE}`);
  }
  assert(/permessage-deflate/.test(inPage.extensions) === EXPECT_DEFLATE, `WebSocket.extensions is "${inPage.extensions}"`);

  for (const u of blocked) console.log(`BLOCKED ${u}`);
  log("test", `requests outside loopback blocked: ${blocked.length}`);
  log("test", `fetch calls recorded in Node: ${fetched.length} ${JSON.stringify(fetched)}`);
  assert(fetched.length === 0, "Node fetched nothing");
}

function header(headers, name) {
  for (const [k, v] of Object.entries(headers || {})) if (k.toLowerCase() === name) return v;
  return undefined;
}

try {
  await main();
  clearTimeout(overall);
  await cleanup();
  console.log("DONE");
  process.exit(0);
} catch (e) {
  await fail(e?.stack ?? String(e));
}
