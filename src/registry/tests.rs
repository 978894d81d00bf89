//! Unit tests of [`Registry::respond`] on the embedded data, through real parsed requests.

use std::sync::OnceLock;

use serde_json::Value;

use super::test_gzip::gunzip;
use super::*;
use crate::config::Limits;
use crate::http::parse;

const BASE: &str = "https://registry.walletconnect.org/logo";

fn reg() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Registry::load(None, BASE).unwrap())
}

/// A response with its body read into memory (file-backed bodies are read from the file).
#[derive(Debug, PartialEq, Eq)]
struct Got {
    status: u16,
    headers: Bytes,
    body: Vec<u8>,
}

impl From<Response> for Got {
    fn from(r: Response) -> Got {
        Got {
            status: r.status,
            headers: r.headers,
            body: r.body.to_vec().unwrap(),
        }
    }
}

fn get_with(target: &str, extra: &str) -> Got {
    let raw = format!("GET {target} HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
    let (_, req) = parse(raw.as_bytes(), &Limits::default()).unwrap().unwrap();
    reg().respond(&req).into()
}

fn get(target: &str) -> Got {
    get_with(target, "")
}

fn header<'a>(r: &'a Got, name: &str) -> Option<&'a str> {
    std::str::from_utf8(&r.headers)
        .ok()?
        .split("\r\n")
        .find_map(|l| {
            let (k, v) = l.split_once(": ")?;
            k.eq_ignore_ascii_case(name).then_some(v)
        })
}

fn json(r: &Got) -> Value {
    assert_eq!(header(r, "Content-Type"), Some(JSON));
    serde_json::from_slice(&r.body).unwrap()
}

fn keys(v: &Value) -> Vec<String> {
    v["listings"].as_object().unwrap().keys().cloned().collect()
}

fn names(v: &Value) -> Vec<String> {
    v["listings"]
        .as_object()
        .unwrap()
        .values()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect()
}

/// Keys of a JSON object in document order (serde_json's map sorts them).
fn raw_keys(body: &[u8]) -> Vec<String> {
    let top: data::Ordered = serde_json::from_slice(body).unwrap();
    let listings = top.0.into_iter().find(|(k, _)| k == "listings").unwrap().1;
    let l: data::Ordered = serde_json::from_str(listings.get()).unwrap();
    l.0.into_iter().map(|(k, _)| k).collect()
}

fn file_keys(bytes: &[u8]) -> Vec<String> {
    let top: data::Ordered = serde_json::from_slice(bytes).unwrap();
    top.0.into_iter().map(|(k, _)| k).collect()
}

#[test]
fn counts_of_the_real_data() {
    for (path, n) in [
        ("/api/v1/wallets", 113),
        ("/api/v1/dapps", 138),
        ("/api/v1/all", 245),
    ] {
        let r = get(path);
        assert_eq!(r.status, 200);
        let v = json(&r);
        assert_eq!(v["count"], n, "{path}");
        assert_eq!(v["total"], n, "{path}");
        assert_eq!(keys(&v).len(), n);
    }
}

#[test]
fn order_is_file_order_and_all_is_wallets_then_dapps() {
    let w = file_keys(EMBEDDED_WALLETS);
    let d = file_keys(EMBEDDED_DAPPS);
    assert_eq!(raw_keys(&get("/api/v1/wallets").body), w);
    assert_eq!(raw_keys(&get("/api/v1/dapps").body), d);
    let mut all = w.clone();
    all.extend(d.iter().filter(|k| !w.contains(k)).cloned());
    assert_eq!(raw_keys(&get("/api/v1/all").body), all);
}

#[test]
fn hybrids_keep_the_wallet_record_in_all() {
    let all = json(&get("/api/v1/all"));
    let dapps = json(&get("/api/v1/dapps"));
    let wallets = json(&get("/api/v1/wallets"));
    let hybrid: Vec<&String> = all["listings"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, e)| e["app_type"] == "hybrid")
        .map(|(k, _)| k)
        .collect();
    assert_eq!(hybrid.len(), 6);
    for id in hybrid {
        assert_eq!(all["listings"][id], wallets["listings"][id]);
        assert_eq!(dapps["listings"][id]["app_type"], "hybrid");
    }
    // Loopring is "Loopring Wallet" as a wallet and "Loopring" as a dApp.
    assert!(names(&all).contains(&"Loopring Wallet".to_string()));
    assert!(!names(&all).contains(&"Loopring".to_string()));
    assert!(names(&dapps).contains(&"Loopring".to_string()));
    let types = |v: &Value| -> HashSet<String> {
        v["listings"]
            .as_object()
            .unwrap()
            .values()
            .map(|e| e["app_type"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        types(&wallets),
        ["wallet", "hybrid"].map(String::from).into()
    );
    assert_eq!(types(&dapps), ["dapp", "hybrid"].map(String::from).into());
}

#[test]
fn entries_keep_their_fields_and_gain_image_urls() {
    let body = std::str::from_utf8(&get("/api/v1/wallets").body)
        .unwrap()
        .to_string();
    let v: Value = serde_json::from_str(&body).unwrap();
    let id = "1ae92b26df02f0abca6304df07debccd18262fdf5fe82daa81593582dac9a369";
    let e = &v["listings"][id];
    assert_eq!(e["name"], "Rainbow");
    assert_eq!(
        e["app"]["ios"],
        "https://apps.apple.com/us/app/rainbow-ethereum-wallet/id1457119021"
    );
    assert_eq!(e["image_url"]["sm"], format!("{BASE}/sm/{id}.jpeg"));
    assert_eq!(e["image_url"]["lg"], format!("{BASE}/lg/{id}.jpeg"));
    // Field order as in the file, our fields last.
    assert!(body.contains(&format!(
        "\"{id}\":{{\"id\":\"{id}\",\"name\":\"Rainbow\",\"description\":\"\",\"homepage\":\"https://rainbow.me/\",\"chains\":[\"eip155:1\"]"
    )));
    // Every field of every file entry is kept with its value.
    let file: Value = serde_json::from_slice(EMBEDDED_WALLETS).unwrap();
    for (k, fe) in file.as_object().unwrap() {
        for (f, val) in fe.as_object().unwrap() {
            assert_eq!(&v["listings"][k][f], val);
        }
    }
}

#[test]
fn search_is_case_insensitive_substring() {
    let v = json(&get("/api/v1/wallets?search=WALLET"));
    let n = names(&v);
    assert!(!n.is_empty());
    assert!(n.iter().all(|x| x.to_lowercase().contains("wallet")));
    let file: Value = serde_json::from_slice(EMBEDDED_WALLETS).unwrap();
    let want = file
        .as_object()
        .unwrap()
        .values()
        .filter(|e| {
            e["name"]
                .as_str()
                .unwrap()
                .to_lowercase()
                .contains("wallet")
        })
        .count();
    assert_eq!(v["count"], want);
    assert_eq!(v["total"], want);
    assert_eq!(
        names(&json(&get("/api/v1/all?search=metamask"))),
        vec!["MetaMask"]
    );
    assert_eq!(
        names(&json(&get("/api/v1/all?search=trust+wallet"))),
        vec!["Trust Wallet"]
    );
    assert_eq!(
        names(&json(&get("/api/v1/all?search=trust%20WALLET"))),
        vec!["Trust Wallet"]
    );
    let none = json(&get("/api/v1/all?search=zzzqqq"));
    assert_eq!(
        (none["count"].clone(), none["total"].clone()),
        (Value::from(0), Value::from(0))
    );
    assert!(keys(&none).is_empty());
    // Empty search = no filter = the full answer.
    assert_eq!(get("/api/v1/all?search=").body, get("/api/v1/all").body);
}

#[test]
fn paging_after_search_with_count_and_total() {
    let full = raw_keys(&get("/api/v1/all").body);
    let p = get("/api/v1/all?entries=10&page=3");
    let v = json(&p);
    assert_eq!(
        (v["count"].as_u64(), v["total"].as_u64()),
        (Some(10), Some(245))
    );
    assert_eq!(raw_keys(&p.body), full[20..30].to_vec());
    let last = json(&get("/api/v1/all?entries=100&page=3"));
    assert_eq!(
        (last["count"].as_u64(), last["total"].as_u64()),
        (Some(45), Some(245))
    );
    let past = json(&get("/api/v1/all?entries=100&page=4"));
    assert_eq!(
        (past["count"].as_u64(), past["total"].as_u64()),
        (Some(0), Some(245))
    );
    let huge = json(&get("/api/v1/all?entries=1000&page=18446744073709551615"));
    assert_eq!(huge["count"], 0);
    // Paging applies after the search filter.
    let all_a = raw_keys(&get("/api/v1/all?search=a").body);
    let page2 = get("/api/v1/all?search=a&entries=5&page=2");
    assert_eq!(raw_keys(&page2.body), all_a[5..10].to_vec());
    assert_eq!(json(&page2)["total"].as_u64(), Some(all_a.len() as u64));
    // A page holding everything is the full answer, byte for byte.
    assert_eq!(
        get("/api/v1/all?entries=1000&page=1").body,
        get("/api/v1/all").body
    );
}

#[test]
fn bad_queries_are_400_naming_the_parameter() {
    for (q, name) in [
        ("entries=10", "page"),
        ("page=1", "entries"),
        ("entries=0&page=1", "entries"),
        ("entries=1&page=0", "page"),
        ("entries=-5&page=1", "entries"),
        ("entries=abc&page=1", "entries"),
        ("entries=1001&page=1", "entries"),
        ("search=%E0%A4", "search"),
        ("search=%", "search"),
        ("search=a&search=b", "search"),
    ] {
        let r = get(&format!("/api/v1/dapps?{q}"));
        assert_eq!(r.status, 400, "{q}");
        let msg = json(&r)["error"].as_str().unwrap().to_string();
        assert!(msg.contains(&format!("\"{name}\"")), "{q}: {msg}");
        assert_eq!(header(&r, "Cache-Control"), Some("public, max-age=300"));
        assert!(header(&r, "ETag").is_some());
    }
    assert_eq!(get("/api/v1/dapps?unknown=1&x").status, 200);
}

#[test]
fn logo_answers_the_image_address() {
    let id = "1ae92b26df02f0abca6304df07debccd18262fdf5fe82daa81593582dac9a369";
    for size in SIZES {
        let r = get(&format!("/api/v1/logo/{size}/{id}"));
        assert_eq!(r.status, 200);
        assert_eq!(header(&r, "Content-Type"), Some(TEXT));
        assert_eq!(&r.body[..], format!("{BASE}/{size}/{id}.jpeg").as_bytes());
        assert!(header(&r, "ETag").is_some());
    }
    let r = get(&format!("/api/v1/logo/xl/{id}"));
    assert_eq!(r.status, 400);
    assert!(json(&r)["error"].as_str().unwrap().contains("size"));
    let r = get("/api/v1/logo/sm/nope");
    assert_eq!(r.status, 404);
    assert!(json(&r)["error"].as_str().unwrap().contains("id"));
    assert_eq!(get(&format!("/api/v1/logo/sm/{id}/x")).status, 404);
    assert_eq!(get("/api/v1/logo/sm").status, 404);
    assert_eq!(get("/api/v1/logo/sm/").status, 404);
    assert_eq!(get("/api/v1/logo/sm/%zz").status, 404);
    // A dApp-only id has a logo too.
    let dapp = "d2ae9c3c2782806fd6db704bf40ef0238af9470d7964ae566114a033f4a9a110";
    assert_eq!(get(&format!("/api/v1/logo/md/{dapp}")).status, 200);
}

#[test]
fn unknown_paths_are_404_json() {
    for p in [
        "/api/v1/",
        "/api/v1/wallet",
        "/api/v1/wallets/",
        "/api/v1/all/x",
        "/api/v1/logo",
    ] {
        let r = get(p);
        assert_eq!(r.status, 404, "{p}");
        assert!(json(&r)["error"].is_string());
    }
}

#[test]
fn etags_and_304() {
    for target in [
        "/api/v1/all",
        "/api/v1/all?entries=10&page=2",
        "/api/v1/wallets?search=wallet",
        "/api/v1/logo/sm/1ae92b26df02f0abca6304df07debccd18262fdf5fe82daa81593582dac9a369",
    ] {
        let r = get(target);
        let tag = header(&r, "ETag").unwrap().to_string();
        assert!(tag.starts_with('"') && tag.ends_with('"'));
        assert_eq!(header(&r, "Cache-Control"), Some("public, max-age=300"));
        assert_eq!(get(target), r, "byte-identical across requests");
        for inm in [
            tag.clone(),
            format!("W/{tag}"),
            format!("\"x\", {tag}"),
            "*".to_string(),
        ] {
            let nm = get_with(target, &format!("If-None-Match: {inm}\r\n"));
            assert_eq!(nm.status, 304, "{target} {inm}");
            assert!(nm.body.is_empty());
            assert_eq!(header(&nm, "ETag"), Some(tag.as_str()));
        }
        assert_eq!(get_with(target, "If-None-Match: \"other\"\r\n").status, 200);
    }
    // Different answers, different tags; gzip and identity differ.
    let a = get("/api/v1/all?entries=10&page=1");
    let b = get("/api/v1/all?entries=10&page=2");
    let c = get_with("/api/v1/all?entries=10&page=1", "Accept-Encoding: gzip\r\n");
    assert_ne!(header(&a, "ETag"), header(&b, "ETag"));
    assert_ne!(header(&a, "ETag"), header(&c, "ETag"));
    assert_eq!(header(&a, "Vary"), Some("Accept-Encoding"));
    // Same body reached by two queries: same tag.
    let s = get("/api/v1/all?search=");
    assert_eq!(header(&s, "ETag"), header(&get("/api/v1/all"), "ETag"));
}

#[test]
fn gzip_when_accepted() {
    for target in [
        "/api/v1/all",
        "/api/v1/wallets",
        "/api/v1/all?entries=100&page=2",
        "/api/v1/all?search=wallet",
        "/api/v1/dapps?search=a&entries=7&page=3",
    ] {
        let plain = get(target);
        let gz = get_with(target, "Accept-Encoding: gzip, deflate\r\n");
        assert_eq!(header(&plain, "Content-Encoding"), None);
        assert_eq!(header(&gz, "Content-Encoding"), Some("gzip"), "{target}");
        assert!(gz.body.len() < plain.body.len());
        assert_eq!(gunzip(&gz.body), plain.body.to_vec(), "{target}");
        assert_eq!(header(&gz, "Vary"), Some("Accept-Encoding"));
        let tag = header(&gz, "ETag").unwrap().to_string();
        let nm = get_with(
            target,
            &format!("Accept-Encoding: gzip\r\nIf-None-Match: {tag}\r\n"),
        );
        assert_eq!(nm.status, 304);
        // The gzip tag does not validate the identity answer.
        assert_eq!(
            get_with(target, &format!("If-None-Match: {tag}\r\n")).status,
            200
        );
    }
    // A page compresses as a whole body does (it is compressed whole).
    let plain = get("/api/v1/all?entries=100&page=2");
    let gz = get_with(
        "/api/v1/all?entries=100&page=2",
        "Accept-Encoding: gzip\r\n",
    );
    assert!(
        gz.body.len() * 5 < plain.body.len(),
        "{} of {}",
        gz.body.len(),
        plain.body.len()
    );
    // Small answers stay identity.
    let small = get_with(
        "/api/v1/all?search=nothing-matches-this",
        "Accept-Encoding: gzip\r\n",
    );
    assert_eq!(header(&small, "Content-Encoding"), None);
}

#[test]
fn clone_is_a_deep_copy_with_identical_answers() {
    let r2 = reg().clone();
    let raw = b"GET /api/v1/all HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n";
    let (_, req) = parse(raw, &Limits::default()).unwrap().unwrap();
    let (a, b) = (reg().respond(&req), r2.respond(&req));
    match (&a.body, &b.body) {
        // The same file through two descriptors.
        (Body::File(x), Body::File(y)) => {
            assert!(!Arc::ptr_eq(&x.file, &y.file));
            assert_eq!(x.offset, y.offset);
        }
        (Body::Mem(x), Body::Mem(y)) => assert_ne!(x.as_ptr(), y.as_ptr()),
        other => panic!("unexpected bodies {other:?}"),
    }
    assert_eq!(Got::from(a), Got::from(b));
}

/// The full lists (both encodings) are sent from the registry's sealed file, not copied;
/// an assembled answer is one buffer holding exactly its entries.
#[test]
fn full_answers_are_file_ranges_and_pages_their_entries() {
    let raw = |t: &str, gz: bool| {
        let enc = if gz { "Accept-Encoding: gzip\r\n" } else { "" };
        format!("GET {t} HTTP/1.1\r\nHost: x\r\n{enc}\r\n")
    };
    let respond = |t: &str, gz: bool| {
        let raw = raw(t, gz);
        let (_, req) = parse(raw.as_bytes(), &Limits::default()).unwrap().unwrap();
        reg().respond(&req)
    };
    for gz in [false, true] {
        let all = respond("/api/v1/all", gz);
        assert!(matches!(all.body, Body::File(_)), "{:?}", all.body);
    }
    let page = respond("/api/v1/all?entries=100&page=2", false);
    assert!(matches!(page.body, Body::Mem(_)), "{:?}", page.body);
    let full = raw_keys(&get("/api/v1/all").body);
    let bytes = page.body.to_vec().unwrap();
    assert_eq!(raw_keys(&bytes), full[100..200].to_vec());
    assert_eq!(json(&Got::from(page))["count"], 100);
}

#[test]
fn load_from_a_directory_and_bad_data() {
    let dir = std::env::temp_dir().join(format!("walletrelay-reg-{}", std::process::id()));
    synth::write_dir(&dir, 500, 9).unwrap();
    let r = Registry::load(Some(&dir), BASE).unwrap();
    assert_eq!(r.len(ListKind::All), 500);
    std::fs::write(
        dir.join("dapps.json"),
        r#"{"k":{"id":"k","name":"A"},"bad":{"id":"bad"}}"#,
    )
    .unwrap();
    let e = Registry::load(Some(&dir), BASE).unwrap_err().to_string();
    assert!(
        e.contains("dapps.json") && e.contains("bad") && e.contains("name"),
        "{e}"
    );
    std::fs::write(dir.join("dapps.json"), "{\"k\": [").unwrap();
    let e = Registry::load(Some(&dir), BASE).unwrap_err().to_string();
    assert!(e.contains("dapps.json") && e.contains("line"), "{e}");
    std::fs::remove_file(dir.join("wallets.json")).unwrap();
    let e = Registry::load(Some(&dir), BASE).unwrap_err().to_string();
    assert!(e.contains("wallets.json"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn image_base_trailing_slash_is_ignored() {
    let r = Registry::load(None, "https://img.example/logo/").unwrap();
    let raw = b"GET /api/v1/logo/sm/1ae92b26df02f0abca6304df07debccd18262fdf5fe82daa81593582dac9a369 HTTP/1.1\r\n\r\n";
    let (_, req) = parse(raw, &Limits::default()).unwrap().unwrap();
    assert!(Got::from(r.respond(&req))
        .body
        .starts_with(b"https://img.example/logo/sm/1ae9"));
}
