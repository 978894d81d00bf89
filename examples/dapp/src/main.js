// The example dApp: pairs with a wallet through walletrelay using today's WalletConnect SDK
// (@walletconnect/sign-client, the browser's own WebSocket), shows the pairing URI as a QR
// code and as text, then the session's accounts, and sends `personal_sign` to the wallet.
//
// Query parameters: relay (default ws://<this page's hostname>:8080, or wss:// when the page
// is served over https), projectId (default "walletrelay-example"; a self-hosted relay accepts
// any unless started with --project-ids).

import { SignClient } from "@walletconnect/sign-client";
import QRCode from "qrcode";

const params = new URLSearchParams(location.search);
const defaultRelay = `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.hostname || "127.0.0.1"}:8080`;
const RELAY_URL = params.get("relay") || defaultRelay;
const PROJECT_ID = params.get("projectId") || "walletrelay-example";
const CHAIN = "eip155:1";
const NAMESPACES = {
  eip155: { chains: [CHAIN], methods: ["personal_sign"], events: ["accountsChanged", "chainChanged"] },
};

const $ = (id) => document.getElementById(id);
const status = (text) => {
  $("status").textContent = text;
};
const hex = (text) =>
  "0x" + Array.from(new TextEncoder().encode(text), (b) => b.toString(16).padStart(2, "0")).join("");

async function main() {
  $("relay").textContent = RELAY_URL;
  status("starting the SDK");
  const client = await SignClient.init({
    projectId: PROJECT_ID,
    relayUrl: RELAY_URL,
    logger: "error",
    telemetryEnabled: false,
    metadata: {
      name: "walletrelay example dApp",
      description: "An example dApp page for walletrelay",
      url: location.origin,
      icons: [],
    },
  });
  // For debugging (and the browser test): the SDK client of this page.
  window.walletrelayDapp = { client, relayUrl: RELAY_URL };

  status("connecting to the relay");
  const { uri, approval } = await client.connect({ optionalNamespaces: NAMESPACES });
  $("uri").textContent = uri;
  await QRCode.toCanvas($("qr"), uri, { errorCorrectionLevel: "M", margin: 2, scale: 4 });
  status("waiting for a wallet to pair and approve");

  const session = await approval();
  const accounts = Object.values(session.namespaces).flatMap((ns) => ns.accounts);
  $("pairing").hidden = true;
  $("session").hidden = false;
  $("peer").textContent = session.peer.metadata?.name ?? "(no name)";
  $("accounts").textContent = accounts.join(", ");
  $("topic").textContent = session.topic;
  status("session approved");

  const [account] = accounts;
  const address = account.split(":")[2];
  const chainId = account.split(":").slice(0, 2).join(":");
  const message = `Hello from the walletrelay example dApp, ${new Date().toISOString()}`;
  $("message").textContent = message;
  $("signing").hidden = false;
  const button = $("sign");
  button.disabled = false;
  button.addEventListener("click", async () => {
    button.disabled = true;
    $("answer").textContent = "";
    status("waiting for the wallet's answer");
    try {
      const result = await client.request({
        topic: session.topic,
        chainId,
        request: { method: "personal_sign", params: [hex(message), address] },
      });
      $("answer").textContent = typeof result === "string" ? result : JSON.stringify(result);
      status("answer received");
    } catch (e) {
      $("error").textContent = `request failed: ${e?.message ?? e}`;
      status("request failed");
    } finally {
      button.disabled = false;
    }
  });
}

main().catch((e) => {
  console.error(e);
  $("error").textContent = `error: ${e?.message ?? e}`;
  status("failed");
});
