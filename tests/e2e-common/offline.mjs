// What every Node script that runs a real WalletConnect SDK against the binary shares
// (tests/e2e-sdk/sdk.mjs, tests/e2e-browser/browser.mjs): no dependencies, imported by
// relative path.

/** Resolves with `p`, or rejects after `ms` naming `what`. */
export function within(p, ms, what) {
  let t;
  const timer = new Promise((_, reject) => {
    t = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([p, timer]).finally(() => clearTimeout(t));
}

/**
 * Cuts Node off from everything but the relay, before the SDK is imported: `fetch` records
 * the URL and throws (the caller fails the script if anything was fetched), unhandled
 * rejections are kept and logged through `log(who, msg)`, and IS_VITEST=true keeps the SDK
 * from its own network calls. Returns the two lists, filled as it goes.
 */
export function offline(log) {
  const fetched = [];
  globalThis.fetch = async (input) => {
    const url = typeof input === "string" ? input : (input?.url ?? String(input));
    fetched.push(url);
    throw new Error(`fetch is disabled in this test (${url})`);
  };
  const unhandled = [];
  process.on("unhandledRejection", (reason) => {
    const text = reason instanceof Error ? reason.stack : JSON.stringify(reason);
    unhandled.push(text);
    log("process", `unhandledRejection: ${text}`);
  });
  process.env.IS_VITEST = "true";
  return { fetched, unhandled };
}
