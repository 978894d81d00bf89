//! Synthetic registries of any size, in the same format as the real one, for benches, load
//! tests and `registry-gen`.
//!
//! Every entry is a real entry of the embedded data (a template, fields in file order) with
//! a fresh 64-hex-digit `id` and a `name` made from a real name plus a suffix word and often
//! a number ("Trust Wallet Pro 4711"). The proportions follow the real data: of `n` entries
//! in `/all`, about 107/245 are wallets only, 6/245 are in both files (hybrid, with the dApp
//! record of another template) and the rest dApps only. Deterministic for a given seed.

use std::io::Write;
use std::path::Path;

use super::data::{minify_into, Ordered};
use super::{EMBEDDED_DAPPS, EMBEDDED_LICENSE, EMBEDDED_WALLETS};
use crate::json;

/// Suffix words appended to real names.
const WORDS: [&str; 20] = [
    "",
    " Pro",
    " Lite",
    " Wallet",
    " Swap",
    " Finance",
    " DAO",
    " X",
    " Mobile",
    " Labs",
    " Exchange",
    " Vault",
    " Protocol",
    " Plus",
    " Connect",
    " One",
    " Network",
    " Bridge",
    " Markets",
    " NFT",
];

/// The two files of a synthetic registry.
#[derive(Debug, Clone)]
pub struct Synthetic {
    /// `wallets.json`.
    pub wallets: Vec<u8>,
    /// `dapps.json`.
    pub dapps: Vec<u8>,
}

/// SplitMix64 (`crate::rng`), with an index-sized `below`.
#[derive(Debug, Clone)]
struct Rng(crate::rng::SplitMix);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn below(&mut self, n: usize) -> usize {
        self.0.below(n as u64) as usize
    }
}

type Template = Vec<(String, Box<serde_json::value::RawValue>)>;

fn templates(bytes: &[u8]) -> Vec<Template> {
    let top: Ordered = match serde_json::from_slice(bytes) {
        Ok(t) => t,
        Err(_) => return Vec::new(),
    };
    top.0
        .into_iter()
        .filter_map(|(_, raw)| serde_json::from_str::<Ordered>(raw.get()).ok().map(|o| o.0))
        .collect()
}

/// Writes one entry from `template` with `id` and `name` replaced.
fn write_entry(out: &mut Vec<u8>, template: Option<&Template>, id: &str, name: &str) {
    json::write_str(out, id);
    out.extend_from_slice(b":{\"id\":");
    json::write_str(out, id);
    out.extend_from_slice(b",\"name\":");
    json::write_str(out, name);
    for (k, v) in template.into_iter().flatten() {
        if k == "id" || k == "name" {
            continue;
        }
        out.push(b',');
        json::write_str(out, k);
        out.push(b':');
        minify_into(out, v.get().as_bytes());
    }
    out.push(b'}');
}

/// Generates a registry whose `/api/v1/all` has `entries` entries.
///
/// Long on purpose: one entry's fields are written in file order, as a real entry reads.
pub fn generate(entries: usize, seed: u64) -> Synthetic {
    let wallet_t = templates(EMBEDDED_WALLETS);
    let dapp_t = templates(EMBEDDED_DAPPS);
    let names: Vec<String> = wallet_t
        .iter()
        .chain(&dapp_t)
        .filter_map(|t| t.iter().find(|(k, _)| k == "name"))
        .filter_map(|(_, v)| serde_json::from_str::<String>(v.get()).ok())
        .collect();
    let mut rng = Rng(crate::rng::SplitMix(seed));
    let hybrid = entries * 6 / 245;
    let wallets_only = entries * 107 / 245;
    let dapps_only = entries - hybrid - wallets_only;
    let n_wallets = wallets_only + hybrid;

    let make = |rng: &mut Rng| {
        let id = format!(
            "{:016x}{:016x}{:016x}{:016x}",
            rng.next(),
            rng.next(),
            rng.next(),
            rng.next()
        );
        let mut name = names
            .get(rng.below(names.len()))
            .cloned()
            .unwrap_or_else(|| "Wallet".into());
        name.push_str(WORDS[rng.below(WORDS.len())]);
        if rng.below(10) < 7 {
            name.push(' ');
            name.push_str(&rng.below(10_000).to_string());
        }
        (id, name)
    };

    // Hybrids are spread evenly over both files.
    let every = |n: usize, k: usize| n.checked_div(k).map_or(usize::MAX, |e| e.max(1));
    let w_every = every(n_wallets, hybrid);
    let mut wallets = Vec::with_capacity(entries * 900);
    let mut dapps = Vec::with_capacity(entries * 900);
    wallets.push(b'{');
    dapps.push(b'{');
    let mut hybrids = Vec::with_capacity(hybrid);
    for i in 0..n_wallets {
        let (id, name) = make(&mut rng);
        if i > 0 {
            wallets.push(b',');
        }
        wallets.push(b'\n');
        let t = wallet_t.get(rng.below(wallet_t.len()));
        write_entry(&mut wallets, t, &id, &name);
        if i % w_every == 0 && hybrids.len() < hybrid {
            hybrids.push((id, name));
        }
    }
    let n_dapps = dapps_only + hybrids.len();
    let d_every = every(n_dapps, hybrids.len());
    let mut hybrids = hybrids.into_iter();
    for i in 0..n_dapps {
        let from_hybrid = if i % d_every == d_every / 2 {
            hybrids.next()
        } else {
            None
        };
        let (id, name) = match from_hybrid {
            Some((id, name)) => {
                // The dApp record of an id in both files often has a shorter name.
                let short = name
                    .rsplit_once(' ')
                    .map_or(name.clone(), |(a, _)| a.to_string());
                (id, short)
            }
            None => make(&mut rng),
        };
        if i > 0 {
            dapps.push(b',');
        }
        dapps.push(b'\n');
        let t = dapp_t.get(rng.below(dapp_t.len()));
        write_entry(&mut dapps, t, &id, &name);
    }
    wallets.extend_from_slice(b"\n}\n");
    dapps.extend_from_slice(b"\n}\n");
    Synthetic { wallets, dapps }
}

/// Writes `wallets.json`, `dapps.json` and `LICENSE.md` of a generated registry into `dir`
/// (created if missing).
pub fn write_dir(dir: &Path, entries: usize, seed: u64) -> std::io::Result<()> {
    let s = generate(entries, seed);
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("wallets.json"), &s.wallets)?;
    std::fs::write(dir.join("dapps.json"), &s.dapps)?;
    let mut lic = std::fs::File::create(dir.join("LICENSE.md"))?;
    writeln!(
        lic,
        "Synthetic registry generated by registry-gen from the WalletConnect registry data.\n"
    )?;
    lic.write_all(EMBEDDED_LICENSE.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::super::{ListKind, Registry};
    use super::*;

    #[test]
    fn generates_the_requested_size_with_real_proportions() {
        for n in [0, 1, 7, 245, 1000] {
            let s = generate(n, 42);
            let r = Registry::from_json(("w", &s.wallets), ("d", &s.dapps), "https://i").unwrap();
            assert_eq!(r.len(ListKind::All), n, "n={n}");
            assert_eq!(r.len(ListKind::Wallets), n * 107 / 245 + n * 6 / 245);
            assert_eq!(
                r.len(ListKind::Wallets) + r.len(ListKind::Dapps) - n,
                n * 6 / 245
            );
        }
    }

    #[test]
    fn is_deterministic() {
        assert_eq!(generate(500, 1).wallets, generate(500, 1).wallets);
        assert_ne!(generate(500, 1).dapps, generate(500, 2).dapps);
    }
}
