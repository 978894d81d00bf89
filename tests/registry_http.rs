//! The registry rules of DECISIONS §2 against the real binary over real HTTP: one test per
//! rule (counts, hybrids, order, search, paging, every 400, logo, 404, caching, gzip, CORS,
//! HEAD, pipelining, large answers); the registry from `--registry-dir` is in
//! `registry_reload.rs`.

mod common;
#[path = "registry_http/pipelined.rs"]
mod pipelined;

use std::fmt;
use std::io::{Read, Write};
use std::net::TcpStream;

use common::gzip::gunzip;
use common::{HttpConn, Resp, Server, SockOpts};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;

const WALLETS: &str = include_str!("../data/registry/wallets.json");
const DAPPS: &str = include_str!("../data/registry/dapps.json");
const BASE: &str = "https://registry.walletconnect.org/logo";
const RAINBOW: &str = "1ae92b26df02f0abca6304df07debccd18262fdf5fe82daa81593582dac9a369";

/// What the registry tests read from an answer.
trait Listings {
    /// The `name` of every listing.
    fn names(&self) -> Vec<String>;
    /// Listing keys in document order.
    fn keys(&self) -> Vec<String>;
}

impl Listings for Resp {
    fn names(&self) -> Vec<String> {
        self.json()["listings"]
            .as_object()
            .unwrap()
            .values()
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect()
    }

    fn keys(&self) -> Vec<String> {
        let top: Ordered = serde_json::from_slice(&self.body).unwrap();
        let listings = top.0.into_iter().find(|(k, _)| k == "listings").unwrap().1;
        let l: Ordered = serde_json::from_str(listings.get()).unwrap();
        l.0.into_iter().map(|(k, _)| k).collect()
    }
}

/// A JSON object's members in document order.
struct Ordered(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Ordered;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Ordered, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = m.next_entry()? {
                    v.push(e);
                }
                Ok(Ordered(v))
            }
        }
        d.deserialize_map(V)
    }
}

fn file_keys(src: &str) -> Vec<String> {
    let o: Ordered = serde_json::from_str(src).unwrap();
    o.0.into_iter().map(|(k, _)| k).collect()
}

fn request(s: &Server, method: &str, target: &str, extra: &str) -> Resp {
    s.request(&format!(
        "{method} {target} HTTP/1.1\r\nHost: t\r\n{extra}\r\n"
    ))
}

fn get(s: &Server, target: &str) -> Resp {
    request(s, "GET", target, "")
}

fn server() -> Server {
    Server::start(&["--threads", "2"])
}

#[test]
fn counts_are_113_wallets_138_dapps_245_all() {
    let s = server();
    for (path, n) in [
        ("/api/v1/wallets", 113),
        ("/api/v1/dapps", 138),
        ("/api/v1/all", 245),
    ] {
        let r = get(&s, path);
        assert_eq!(r.status, 200);
        let v = r.json();
        assert_eq!(v["count"], n, "{path}");
        assert_eq!(v["total"], n, "{path}");
        assert_eq!(v["listings"].as_object().unwrap().len(), n);
    }
}

#[test]
fn entries_have_id_name_app_type_and_image_urls() {
    let s = server();
    let v = get(&s, "/api/v1/all").json();
    for (k, e) in v["listings"].as_object().unwrap() {
        assert_eq!(e["id"].as_str(), Some(k.as_str()));
        assert!(e["name"].is_string());
        assert!(["wallet", "dapp", "hybrid"].contains(&e["app_type"].as_str().unwrap()));
        for size in ["sm", "md", "lg"] {
            assert_eq!(e["image_url"][size], format!("{BASE}/{size}/{k}.jpeg"));
        }
    }
}

#[test]
fn hybrid_ids_appear_once_in_the_wallets_place_with_the_wallet_record() {
    let s = server();
    let all = get(&s, "/api/v1/all");
    let wallets = get(&s, "/api/v1/wallets").json();
    let dapps = get(&s, "/api/v1/dapps").json();
    let keys = all.keys();
    let all = all.json();
    let hybrid: Vec<&String> = keys
        .iter()
        .filter(|k| all["listings"][k.as_str()]["app_type"] == "hybrid")
        .collect();
    assert_eq!(hybrid.len(), 6);
    let wallet_keys = file_keys(WALLETS);
    for id in hybrid {
        assert_eq!(all["listings"][id], wallets["listings"][id]);
        assert_eq!(dapps["listings"][id]["app_type"], "hybrid");
        assert_eq!(wallets["listings"][id]["app_type"], "hybrid");
        // In the wallets' part of /all, at the wallet's index.
        let pos = keys.iter().position(|k| k == id).unwrap();
        assert_eq!(wallet_keys.iter().position(|k| k == id), Some(pos));
    }
    assert_eq!(keys.len(), 245, "no id twice");
}

#[test]
fn order_is_file_order_wallets_then_dapps() {
    let s = server();
    let w = file_keys(WALLETS);
    let d = file_keys(DAPPS);
    assert_eq!(get(&s, "/api/v1/wallets").keys(), w);
    assert_eq!(get(&s, "/api/v1/dapps").keys(), d);
    let mut all = w.clone();
    all.extend(d.into_iter().filter(|k| !w.contains(k)));
    assert_eq!(get(&s, "/api/v1/all").keys(), all);
    // Paged answers keep the order too.
    assert_eq!(
        get(&s, "/api/v1/all?entries=7&page=5").keys(),
        all[28..35].to_vec()
    );
}

#[test]
fn search_ignores_case_decodes_percent_and_plus() {
    let s = server();
    assert_eq!(
        get(&s, "/api/v1/all?search=metamask").names(),
        vec!["MetaMask"]
    );
    assert_eq!(
        get(&s, "/api/v1/all?search=METAMASK").names(),
        vec!["MetaMask"]
    );
    assert_eq!(
        get(&s, "/api/v1/all?search=trust+wallet").names(),
        vec!["Trust Wallet"]
    );
    assert_eq!(
        get(&s, "/api/v1/all?search=Trust%20Wallet").names(),
        vec!["Trust Wallet"]
    );
    assert_eq!(
        get(&s, "/api/v1/all?search=%54rust%20w").names(),
        vec!["Trust Wallet"]
    );
    // Substring anywhere in the name; every hit contains it, every name containing it hits.
    let r = get(&s, "/api/v1/wallets?search=WaLlEt");
    let v = r.json();
    let file: Value = serde_json::from_str(WALLETS).unwrap();
    let want: Vec<String> = file_keys(WALLETS)
        .into_iter()
        .filter(|k| {
            file[k]["name"]
                .as_str()
                .unwrap()
                .to_lowercase()
                .contains("wallet")
        })
        .collect();
    assert!(want.len() > 10);
    assert_eq!(r.keys(), want);
    assert_eq!(v["count"], want.len());
    assert_eq!(v["total"], want.len());
}

#[test]
fn search_without_match_is_an_empty_200() {
    let s = server();
    let r = get(&s, "/api/v1/dapps?search=no+such+thing+anywhere");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json(),
        serde_json::json!({"count": 0, "total": 0, "listings": {}})
    );
    // An empty search is no filter.
    assert_eq!(
        get(&s, "/api/v1/dapps?search=").body,
        get(&s, "/api/v1/dapps").body
    );
}

#[test]
fn paging_edges() {
    let s = server();
    let all = get(&s, "/api/v1/all").keys();
    let p = |q: &str| get(&s, &format!("/api/v1/all?{q}"));
    let first = p("entries=1&page=1");
    assert_eq!(first.keys(), all[..1].to_vec());
    assert_eq!(first.json()["count"], 1);
    assert_eq!(first.json()["total"], 245);
    let last = p("entries=100&page=3");
    assert_eq!(last.keys(), all[200..].to_vec());
    assert_eq!(last.json()["count"], 45);
    assert_eq!(last.json()["total"], 245);
    let past = p("entries=100&page=4");
    assert_eq!(past.status, 200);
    assert_eq!(
        past.json(),
        serde_json::json!({"count": 0, "total": 245, "listings": {}})
    );
    assert_eq!(p("entries=245&page=2").json()["count"], 0);
    assert_eq!(
        p("entries=1000&page=99999999999999999999").json()["count"],
        0
    );
    assert_eq!(p("entries=1000&page=1").body, get(&s, "/api/v1/all").body);
    // Paging applies after the search filter.
    let found = p("search=a").keys();
    let page = p("search=a&entries=4&page=2");
    assert_eq!(page.keys(), found[4..8].to_vec());
    assert_eq!(page.json()["total"], found.len());
    assert_eq!(p("page=2&search=a&entries=4").body, page.body);
}

#[test]
fn every_bad_query_is_400_naming_the_parameter() {
    let s = server();
    for (q, name) in [
        ("entries=10", "page"),
        ("page=2", "entries"),
        ("entries=0&page=1", "entries"),
        ("entries=1&page=0", "page"),
        ("entries=-1&page=1", "entries"),
        ("entries=1&page=-3", "page"),
        ("entries=ten&page=1", "entries"),
        ("entries=1&page=1.5", "page"),
        ("entries=1&page=", "page"),
        ("entries=1001&page=1", "entries"),
        ("entries=5&page=1&entries=6", "entries"),
        ("search=a&search=b", "search"),
        ("search=%G1", "search"),
        ("search=abc%", "search"),
        ("search=%FF%FE", "search"),
    ] {
        for path in ["/api/v1/wallets", "/api/v1/dapps", "/api/v1/all"] {
            let r = get(&s, &format!("{path}?{q}"));
            assert_eq!(r.status, 400, "{path}?{q}");
            let msg = r.json()["error"].as_str().unwrap().to_string();
            assert!(msg.contains(&format!("\"{name}\"")), "{q}: {msg}");
        }
    }
    // Unknown parameters are ignored.
    assert_eq!(
        get(&s, "/api/v1/all?foo=bar&foo=baz&utm_source=x").body,
        get(&s, "/api/v1/all").body
    );
}

#[test]
fn logo_in_three_sizes_bad_size_and_unknown_id() {
    let s = server();
    for size in ["sm", "md", "lg"] {
        let r = get(&s, &format!("/api/v1/logo/{size}/{RAINBOW}"));
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
        assert_eq!(
            String::from_utf8(r.body).unwrap(),
            format!("{BASE}/{size}/{RAINBOW}.jpeg")
        );
    }
    let bad = get(&s, &format!("/api/v1/logo/xl/{RAINBOW}"));
    assert_eq!(bad.status, 400);
    assert!(bad.json()["error"].as_str().unwrap().contains("size"));
    let unknown = get(&s, "/api/v1/logo/sm/0000");
    assert_eq!(unknown.status, 404);
    assert!(unknown.json()["error"].is_string());
}

#[test]
fn image_base_flag_changes_logo_addresses() {
    let s = Server::start(&["--image-base", "https://cdn.example/l"]);
    let r = get(&s, &format!("/api/v1/logo/md/{RAINBOW}"));
    assert_eq!(
        r.body,
        format!("https://cdn.example/l/md/{RAINBOW}.jpeg").as_bytes()
    );
    let v = get(&s, "/api/v1/wallets?search=rainbow").json();
    assert_eq!(
        v["listings"][RAINBOW]["image_url"]["lg"],
        format!("https://cdn.example/l/lg/{RAINBOW}.jpeg")
    );
}

#[test]
fn unknown_registry_paths_are_404_json() {
    let s = server();
    for p in [
        "/api/v1/",
        "/api/v1/nope",
        "/api/v1/wallets/",
        "/api/v1/all/1",
        "/api/v1/logo",
        "/api/v1/logo/sm",
    ] {
        let r = get(&s, p);
        assert_eq!(r.status, 404, "{p}");
        assert!(r.json()["error"].is_string(), "{p}");
    }
}

#[test]
fn etag_cache_control_and_304() {
    let s = server();
    for target in [
        "/api/v1/all".to_string(),
        "/api/v1/wallets?entries=10&page=2".to_string(),
        "/api/v1/dapps?search=swap".to_string(),
        format!("/api/v1/logo/lg/{RAINBOW}"),
    ] {
        for enc in ["", "Accept-Encoding: gzip\r\n"] {
            let r = request(&s, "GET", &target, enc);
            assert_eq!(r.status, 200);
            assert_eq!(r.header("cache-control"), Some("public, max-age=300"));
            let tag = r.header("etag").unwrap().to_string();
            assert!(tag.starts_with('"') && tag.ends_with('"'), "strong tag");
            for inm in [tag.clone(), format!("W/{tag}"), format!("\"zz\", {tag}")] {
                let nm = request(
                    &s,
                    "GET",
                    &target,
                    &format!("{enc}If-None-Match: {inm}\r\n"),
                );
                assert_eq!(nm.status, 304, "{target} {inm}");
                assert!(nm.body.is_empty());
                assert_eq!(nm.header("etag"), Some(tag.as_str()));
                assert_eq!(nm.header("cache-control"), Some("public, max-age=300"));
            }
            let star = request(&s, "GET", &target, &format!("{enc}If-None-Match: *\r\n"));
            assert_eq!(star.status, 304);
            let other = request(
                &s,
                "GET",
                &target,
                &format!("{enc}If-None-Match: \"x\"\r\n"),
            );
            assert_eq!(other.status, 200);
            assert_eq!(other.body, r.body);
        }
    }
}

#[test]
fn answers_are_byte_identical_across_requests_and_workers() {
    let s = server();
    for target in ["/api/v1/all", "/api/v1/all?search=wallet&entries=3&page=2"] {
        let first = get(&s, target);
        for _ in 0..8 {
            let r = get(&s, target);
            assert_eq!(r.body, first.body);
            assert_eq!(r.header("etag"), first.header("etag"));
        }
    }
}

#[test]
fn gzip_round_trip() {
    let s = server();
    for target in [
        "/api/v1/all",
        "/api/v1/wallets",
        "/api/v1/dapps",
        "/api/v1/all?entries=100&page=2",
        "/api/v1/all?search=swap",
        "/api/v1/all?search=e&entries=50&page=2",
    ] {
        let plain = get(&s, target);
        let gz = request(&s, "GET", target, "Accept-Encoding: gzip, br\r\n");
        assert_eq!(plain.header("content-encoding"), None);
        assert_eq!(gz.header("content-encoding"), Some("gzip"), "{target}");
        assert_eq!(gz.header("vary"), Some("Accept-Encoding"));
        assert_eq!(plain.header("vary"), Some("Accept-Encoding"));
        assert_eq!(gz.header("content-type"), plain.header("content-type"));
        assert!(gz.body.len() < plain.body.len(), "{target}");
        assert_eq!(gunzip(&gz.body), plain.body, "{target}");
        assert_ne!(gz.header("etag"), plain.header("etag"));
    }
    // gzip;q=0 is a refusal.
    let r = request(&s, "GET", "/api/v1/all", "Accept-Encoding: gzip;q=0\r\n");
    assert_eq!(r.header("content-encoding"), None);
}

#[test]
fn cors_header_on_every_registry_answer() {
    let s = server();
    for target in [
        "/api/v1/all",
        "/api/v1/all?entries=1&page=1",
        "/api/v1/all?entries=0&page=1",
        "/api/v1/logo/xx/1",
        "/api/v1/nope",
    ] {
        let r = get(&s, target);
        assert_eq!(
            r.header("access-control-allow-origin"),
            Some("*"),
            "{target}"
        );
    }
    let pre = request(
        &s,
        "OPTIONS",
        "/api/v1/all",
        "Origin: https://dapp.example\r\nAccess-Control-Request-Method: GET\r\n",
    );
    assert_eq!(pre.status, 204);
    assert_eq!(pre.header("access-control-allow-origin"), Some("*"));
}

#[test]
fn head_has_get_headers_without_body() {
    let s = server();
    for target in [
        "/api/v1/all",
        "/api/v1/all?search=wallet&entries=2&page=1",
        "/api/v1/all?entries=2",
        "/api/v1/logo/sm/1ae92b26df02f0abca6304df07debccd18262fdf5fe82daa81593582dac9a369",
    ] {
        let g = get(&s, target);
        // HEAD then GET on one connection: the HEAD must not leave body bytes behind.
        let mut c = HttpConn::open(&s);
        c.send(
            format!(
                "HEAD {target} HTTP/1.1\r\nHost: t\r\n\r\nGET {target} HTTP/1.1\r\nHost: t\r\n\r\n"
            )
            .as_bytes(),
        );
        let h = c.response(true);
        let g2 = c.response(false);
        assert_eq!(h.status, g.status);
        assert_eq!(
            h.header("content-length").unwrap(),
            g.body.len().to_string()
        );
        assert_eq!(h.header("etag"), g.header("etag"));
        assert_eq!(h.header("content-type"), g.header("content-type"));
        assert!(h.body.is_empty());
        assert_eq!(g2.body, g.body);
    }
}

#[test]
fn pipelined_queries_on_one_connection_answer_in_order() {
    let s = server();
    let a = get(&s, "/api/v1/all?search=rainbow");
    let b = get(&s, "/api/v1/dapps?entries=3&page=2");
    let c_ = get(&s, "/api/v1/all");
    let mut c = HttpConn::open(&s);
    c.send(
        b"GET /api/v1/all?search=rainbow HTTP/1.1\r\nHost: t\r\n\r\n\
          GET /api/v1/dapps?entries=3&page=2 HTTP/1.1\r\nHost: t\r\n\r\n\
          GET /api/v1/all HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!(c.response(false).body, a.body);
    assert_eq!(c.response(false).body, b.body);
    assert_eq!(c.response(false).body, c_.body);
}
