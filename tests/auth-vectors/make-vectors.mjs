// Makes the relay-auth test vectors with the SDK's own package (@walletconnect/relay-auth,
// pinned in package.json), exactly as clients sign in. Run once and commit the output:
//   npm ci && node make-vectors.mjs > ../../src/auth/vectors.json
// The Rust unit tests in src/auth/ read that file; they never need node.
import { generateKeyPair, signJWT, verifyJWT, encodeIss } from "@walletconnect/relay-auth";

// A fixed seed, so re-running gives the same key (and, Ed25519 being deterministic, the same
// tokens). This key signs nothing but these test vectors.
const seed = new Uint8Array(32).map((_, i) => i + 1);
const keyPair = generateKeyPair(seed);
const hex = (b) => Buffer.from(b).toString("hex");

const sub = "c479fe5dc464e771e78b193d239a65b58d278cad1c34bfb0b5716e5bb514928e";
const aud = "wss://relay.walletconnect.org";
const ttl = 86400;
const iat = 1_700_000_000;

async function vector(name, aud, iat) {
  const token = await signJWT(sub, aud, ttl, keyPair, iat);
  if (!(await verifyJWT(token))) throw new Error(`relay-auth refuses its own ${name} token`);
  const [h, p] = token.split(".");
  return {
    name,
    token,
    header_json: Buffer.from(h, "base64url").toString("utf8"),
    payload_json: Buffer.from(p, "base64url").toString("utf8"),
    aud,
    iat,
    exp: iat + ttl,
  };
}

// What signJWT does without an explicit iat (its default clock), to record the unit.
const now = await signJWT(sub, aud, ttl, keyPair);
const nowPayload = JSON.parse(Buffer.from(now.split(".")[1], "base64url").toString("utf8"));

const out = {
  generator: "@walletconnect/relay-auth@1.1.0 generateKeyPair(seed 01..20) + signJWT",
  seed_hex: hex(seed),
  public_key_hex: hex(keyPair.publicKey),
  iss: encodeIss(keyPair.publicKey),
  sub,
  default_iat_unit: nowPayload.iat < 1e11 ? "seconds" : "milliseconds",
  vectors: [
    await vector("valid", aud, iat),
    await vector("other_aud", "wss://relay.example.com", iat),
    await vector("expired", aud, 1_600_000_000),
  ],
};
console.log(JSON.stringify(out, null, 2));
