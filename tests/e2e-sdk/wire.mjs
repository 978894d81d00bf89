// The SDK's WebSocket frames, watched (sdk.mjs). Node 20 has no global WebSocket, so
// @walletconnect/jsonrpc-ws-connection uses the `ws` package, whose `send` and `emit` are
// wrapped here: requests sent, error answers and closes are kept for the failure message, and
// every publish and push by tag; with `wireLog` every frame is printed (tagged with the
// connection's number).

import { createRequire } from "node:module";

const require = createRequire(import.meta.url);

// Starts watching; returns `{ wireTrouble, tagged }`: the error answers and closes seen, and
// `{conn, tag, kind: "sent" | "answered" | "pushed", at}` for publishes and pushes by tag.
export function watchWire({ log, wireLog, t0 }) {
  const wireTrouble = [];
  const tagged = [];
  if (typeof globalThis.WebSocket !== "undefined") {
    log("wire", "note: this Node has a global WebSocket; the SDK uses it and the frame watch sees nothing");
  }
  const WS = require("ws");
  let conns = 0;
  const sent = new Map(); // request id -> method
  const sentTag = new Map(); // irn_publish id -> tag
  const origSend = WS.prototype.send;
  WS.prototype.send = function (data, ...rest) {
    if (wireLog) log("wire", `#${this.__n} >> ${data}`);
    try {
      const m = JSON.parse(String(data));
      if (m.method) sent.set(String(m.id), m.method);
      if (m.method === "irn_publish" && m.params?.tag !== undefined) {
        sentTag.set(String(m.id), m.params.tag);
        tagged.push({ conn: this.__n, tag: m.params.tag, kind: "sent", at: Date.now() });
      }
    } catch {}
    return origSend.call(this, data, ...rest);
  };
  const origEmit = WS.prototype.emit;
  WS.prototype.emit = function (ev, ...args) {
    if (ev === "open") {
      this.__n = ++conns;
      if (wireLog) log("wire", `#${this.__n} open ${this.url}`);
    } else if (ev === "message") {
      if (wireLog) log("wire", `#${this.__n} << ${args[0]}`);
      try {
        const m = JSON.parse(String(args[0]));
        if (m.result !== undefined && sentTag.has(String(m.id))) {
          tagged.push({ conn: this.__n, tag: sentTag.get(String(m.id)), kind: "answered", at: Date.now() });
        }
        if (m.method === "irn_subscription" && m.params?.data?.tag !== undefined) {
          tagged.push({ conn: this.__n, tag: m.params.data.tag, kind: "pushed", at: Date.now() });
        }
        if (m.error) {
          const what = `#${this.__n} ${sent.get(String(m.id)) ?? "?"} (id ${m.id}) answered with error ${JSON.stringify(m.error)}`;
          wireTrouble.push(`[${((Date.now() - t0) / 1000).toFixed(3)}s] ${what}`);
          log("wire", what);
        }
      } catch {}
    } else if (ev === "close") {
      const what = `#${this.__n} closed: code ${args[0]} ${args[1] ?? ""}`;
      wireTrouble.push(`[${((Date.now() - t0) / 1000).toFixed(3)}s] ${what}`);
      if (wireLog) log("wire", what);
    } else if (ev === "unexpected-response") {
      const res = args[1];
      const what = `upgrade of ${this.url} refused: HTTP ${res?.statusCode}`;
      wireTrouble.push(`[${((Date.now() - t0) / 1000).toFixed(3)}s] ${what}`);
      log("wire", what);
    } else if (ev === "error") {
      const what = `#${this.__n ?? "-"} socket error: ${args[0]?.message ?? args[0]}`;
      wireTrouble.push(`[${((Date.now() - t0) / 1000).toFixed(3)}s] ${what}`);
      if (wireLog) log("wire", what);
    } else if (ev === "ping" && wireLog) {
      log("wire", `#${this.__n} << ping`);
    }
    return origEmit.call(this, ev, ...args);
  };
  return { wireTrouble, tagged };
}
