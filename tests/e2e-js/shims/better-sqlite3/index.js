"use strict";
// Stand-in for better-sqlite3, wired in by the npm "overrides" of ../../package.json.
//
// @walletconnect/client 2.0.0-beta.19 depends on keyvaluestorage@0.7.1, whose Node entry point
// requires better-sqlite3@^7 at load time. better-sqlite3 7.x is a native addon that no longer
// compiles against Node 20's V8, and building any version needs a C++ toolchain and network
// access for prebuilt binaries. The e2e test never uses it: pair.mjs passes its own in-memory
// `storage` (the client's documented IKeyValueStorage option), so keyvaluestorage's SQLite
// backend is never constructed. Constructing it anyway fails loudly instead of silently.
class Database {
  constructor() {
    throw new Error(
      "better-sqlite3 is stubbed out in tests/e2e-js: pass `storage` to Client.init instead",
    );
  }
}
module.exports = Database;
module.exports.default = Database;
