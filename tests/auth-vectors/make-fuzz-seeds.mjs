// Writes the seeds of the `jwt` fuzz target (fuzz/corpus/jwt/) from the SDK's own tokens:
//   npm ci && node make-fuzz-seeds.mjs
// Each seed is one flags byte (see fuzz/fuzz_targets/jwt.rs: 0 = token at the vectors' `now`,
// 8 = upgrade request) and the input. Tokens with other headers are signed with the same
// key by node's own Ed25519, so only the header is wrong.
import { createPrivateKey, sign } from "node:crypto";
import { mkdirSync, writeFileSync } from "node:fs";
import { generateKeyPair, signJWT } from "@walletconnect/relay-auth";

const dir = new URL("../../fuzz/corpus/jwt/", import.meta.url);
mkdirSync(dir, { recursive: true });
const seed = new Uint8Array(32).map((_, i) => i + 1);
const keyPair = generateKeyPair(seed);
const sub = "c479fe5dc464e771e78b193d239a65b58d278cad1c34bfb0b5716e5bb514928e";
const aud = "wss://relay.walletconnect.org";
const iat = 1_700_000_000;
const valid = await signJWT(sub, aud, 86400, keyPair, iat);
const [h, p, s] = valid.split(".");

const pkcs8 = Buffer.concat([Buffer.from("302e020100300506032b657004220420", "hex"), seed]);
const key = createPrivateKey({ key: pkcs8, format: "der", type: "pkcs8" });
const b64 = (b) => Buffer.from(b).toString("base64url");
const signed = (header, payload) => {
  const data = `${b64(header)}.${b64(payload)}`;
  return `${data}.${b64(sign(null, Buffer.from(data), key))}`;
};
const payload = Buffer.from(p, "base64url");

const seeds = {
  valid: valid,
  valid_other_aud: await signJWT(sub, "wss://relay.example.com", 86400, keyPair, iat),
  expired: await signJWT(sub, aud, 86400, keyPair, 1_600_000_000),
  truncated_sig: valid.slice(0, -10),
  truncated_payload: `${h}.${p.slice(0, 40)}`,
  truncated_header: valid.slice(0, 12),
  resigned: `${h}.${b64(payload.toString().replace("1700086400", "1900086400"))}.${s}`,
  flipped_sig: `${h}.${p}.${b64(Buffer.from(s, "base64url").map((b, i) => (i === 5 ? b ^ 1 : b)))}`,
  padded: `${h}.${p}.${s}==`,
  alg_hs256: signed('{"alg":"HS256","typ":"JWT"}', payload),
  alg_none: signed('{"alg":"none"}', payload),
  alg_none_unsigned: `${b64('{"alg":"none"}')}.${p}.`,
  extra_header_keys: signed('{"typ":"JWT","alg":"EdDSA","kid":"k"}', payload),
  float_claims: signed('{"alg":"EdDSA","typ":"JWT"}', payload.toString().replace(":1700000000", ":1700000000.5")),
  huge: `${h}.${"A".repeat(5000)}.${s}`,
  non_utf8_payload: signed('{"alg":"EdDSA","typ":"JWT"}', Buffer.from([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x7d])),
  x25519_issuer: signed(
    '{"alg":"EdDSA","typ":"JWT"}',
    // 0xec 0x01 is the X25519 multicodec: "did:key:z6LS..."
    payload.toString().replace(/"iss":"[^"]*"/, '"iss":"did:key:z6LSbysY2xFMRpGMhb7tFTLMpeuPRaqaWM1yECx2AtzE3KCc"'),
  ),
};
for (const [name, token] of Object.entries(seeds)) {
  writeFileSync(new URL(name, dir), Buffer.concat([Buffer.from([0]), Buffer.from(token)]));
}
// A token whose bytes are not UTF-8 at all.
writeFileSync(new URL("non_utf8_token", dir), Buffer.concat([Buffer.from([0]), Buffer.from(h), Buffer.from([0x2e, 0xff, 0x2e, 0xc3])]));
// Upgrade requests: the SDK's query, and a Bearer header.
const query = `auth=${valid}&projectId=0123456789abcdef0123456789abcdef&ua=wc-2%2Fjs-2.25.0&useOnCloseEvent=true`;
writeFileSync(new URL("upgrade_query", dir), Buffer.concat([Buffer.from([8]), Buffer.from(query)]));
writeFileSync(new URL("upgrade_bearer", dir), Buffer.concat([Buffer.from([8]), Buffer.from(`projectId=p\nBearer ${valid}`)]));
writeFileSync(new URL("upgrade_percent", dir), Buffer.concat([Buffer.from([8]), Buffer.from(`auth=${valid.replaceAll(".", "%2E")}&projectId=a%20b`)]));
