//! Reading the registry files: turns the bytes of `wallets.json` and `dapps.json` into
//! validated [`Record`]s whose JSON is already serialized, compact and final.
//!
//! It owns the file format and its validation (object keyed by id, string `id` and `name`,
//! key equal to `id`, no duplicates) and the two fields we add (`app_type`, `image_url`).
//! Field order and values are kept byte for byte as in the file: each value is taken as raw
//! JSON text and only its insignificant whitespace is removed. It knows nothing of HTTP.

use std::collections::HashSet;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::RegistryError;
use crate::json::{self, StringState};

/// The logo sizes, in the order they appear in `image_url`.
pub const SIZES: [&str; 3] = ["sm", "md", "lg"];

/// Fields the file may not set: we add them ourselves (a file's own copy is dropped).
const ADDED_FIELDS: [&str; 2] = ["app_type", "image_url"];

/// A JSON object read with its keys in file order and its values as raw JSON text.
pub(crate) struct Ordered(pub(crate) Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(OrderedVisitor)
    }
}

struct OrderedVisitor;

impl<'de> Visitor<'de> for OrderedVisitor {
    type Value = Ordered;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
        let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0).min(1024));
        while let Some((k, v)) = map.next_entry::<String, Box<RawValue>>()? {
            out.push((k, v));
        }
        Ok(Ordered(out))
    }
}

/// Which file an entry came from, and whether its id is in the other file too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppType {
    /// Only in `wallets.json`.
    Wallet,
    /// Only in `dapps.json`.
    Dapp,
    /// In both files.
    Hybrid,
}

impl AppType {
    /// The value of the `app_type` field.
    pub fn as_str(self) -> &'static str {
        match self {
            AppType::Wallet => "wallet",
            AppType::Dapp => "dapp",
            AppType::Hybrid => "hybrid",
        }
    }
}

/// One validated entry of one file, before its `app_type` is known.
pub(crate) struct RawEntry {
    /// The entry's `id` (equal to its key).
    pub id: String,
    /// The entry's `name`.
    pub name: String,
    /// The file's fields in file order, compact, without braces: `"id":"..","name":"..",...`.
    pub fields: Vec<u8>,
}

/// One entry as served: its id, name and its finished `"<id>":{...}` JSON member.
#[derive(Debug)]
pub(crate) struct Record {
    /// The entry's id.
    pub id: String,
    /// The entry's name (what `search` matches).
    pub name: String,
    /// `"<id>":{<fields>,"app_type":"..","image_url":{..}}`, compact.
    pub json: Vec<u8>,
}

/// Parses one registry file (`file` names it in errors).
pub(crate) fn parse_file(file: &str, bytes: &[u8]) -> Result<Vec<RawEntry>, RegistryError> {
    let top: Ordered = serde_json::from_slice(bytes).map_err(|e| RegistryError::Json {
        file: file.to_string(),
        source: e,
    })?;
    let mut seen = HashSet::with_capacity(top.0.len());
    let mut out = Vec::with_capacity(top.0.len());
    for (key, raw) in top.0 {
        let bad = |msg: String| RegistryError::Entry {
            file: file.to_string(),
            entry: key.clone(),
            msg,
        };
        if !seen.insert(key.clone()) {
            return Err(bad("the key appears more than once".into()));
        }
        let obj: Ordered = serde_json::from_str(raw.get())
            .map_err(|e| bad(format!("the entry is not a JSON object ({e})")))?;
        let mut fields = Vec::with_capacity(raw.get().len());
        let mut id = None;
        let mut name = None;
        let mut field_names = HashSet::with_capacity(obj.0.len());
        for (k, v) in &obj.0 {
            if !field_names.insert(k.as_str()) {
                return Err(bad(format!("field {k:?} appears more than once")));
            }
            match k.as_str() {
                "id" => id = serde_json::from_str::<String>(v.get()).ok(),
                "name" => name = serde_json::from_str::<String>(v.get()).ok(),
                _ if ADDED_FIELDS.contains(&k.as_str()) => continue,
                _ => {}
            }
            if !fields.is_empty() {
                fields.push(b',');
            }
            json::write_str(&mut fields, k);
            fields.push(b':');
            minify_into(&mut fields, v.get().as_bytes());
        }
        let id = id.ok_or_else(|| bad("missing or non-string \"id\"".into()))?;
        let name = name.ok_or_else(|| bad("missing or non-string \"name\"".into()))?;
        if id.is_empty() {
            return Err(bad("\"id\" is empty".into()));
        }
        if id != key {
            return Err(bad(format!(
                "the key differs from the entry's \"id\" {id:?}"
            )));
        }
        out.push(RawEntry { id, name, fields });
    }
    Ok(out)
}

/// Finishes an entry: adds `app_type` and `image_url` and wraps it as a `"<id>":{...}` member.
pub(crate) fn finish(entry: RawEntry, app_type: AppType, image_base: &str) -> Record {
    let mut json =
        Vec::with_capacity(entry.fields.len() + entry.id.len() * 4 + 3 * image_base.len() + 96);
    json::write_str(&mut json, &entry.id);
    json.extend_from_slice(b":{");
    json.extend_from_slice(&entry.fields);
    json.extend_from_slice(b",\"app_type\":\"");
    json.extend_from_slice(app_type.as_str().as_bytes());
    json.extend_from_slice(b"\",\"image_url\":{");
    for (i, size) in SIZES.iter().enumerate() {
        if i > 0 {
            json.push(b',');
        }
        json.push(b'"');
        json.extend_from_slice(size.as_bytes());
        json.extend_from_slice(b"\":");
        json::write_str(&mut json, &logo_url(image_base, size, &entry.id));
    }
    json.extend_from_slice(b"}}");
    Record {
        id: entry.id,
        name: entry.name,
        json,
    }
}

/// `{image_base}/{size}/{id}.jpeg`; bytes of the id outside the URL-unreserved set are
/// percent-encoded (real ids are hex and come out unchanged).
pub fn logo_url(image_base: &str, size: &str, id: &str) -> String {
    let mut s = String::with_capacity(image_base.len() + size.len() + id.len() + 8);
    s.push_str(image_base);
    s.push('/');
    s.push_str(size);
    s.push('/');
    for &b in id.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            s.push(char::from(b));
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            s.push('%');
            s.push(char::from(HEX[usize::from(b >> 4)]));
            s.push(char::from(HEX[usize::from(b & 15)]));
        }
    }
    s.push_str(".jpeg");
    s
}

/// Appends valid JSON text `raw` without its insignificant whitespace. Strings (and so
/// their escapes) and numbers are copied byte for byte.
pub(crate) fn minify_into(out: &mut Vec<u8>, raw: &[u8]) {
    let mut strings = StringState::default();
    for &b in raw {
        // `inside` first: it must see every byte.
        if strings.inside(b) || !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
            out.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(bytes: &str) -> String {
        match parse_file("x.json", bytes.as_bytes()) {
            Ok(_) => panic!("accepted {bytes}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn keeps_field_order_and_raw_values() {
        let src =
            r#"{ "a": { "name" : "N\u00e9 x", "id":"a", "n": 1.50, "z": [ 1, {"q" : " s "} ] } }"#;
        let e = parse_file("x.json", src.as_bytes()).unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].name, "Né x");
        assert_eq!(
            std::str::from_utf8(&e[0].fields).unwrap(),
            r#""name":"N\u00e9 x","id":"a","n":1.50,"z":[1,{"q":" s "}]"#
        );
    }

    #[test]
    fn finish_adds_app_type_and_image_url() {
        let mut e = parse_file(
            "x.json",
            br#"{"a b":{"id":"a b","name":"A","app_type":"old"}}"#,
        )
        .unwrap();
        let r = finish(e.remove(0), AppType::Hybrid, "https://img");
        let v: serde_json::Value =
            serde_json::from_slice(&[b"{", &r.json[..], b"}"].concat()).unwrap();
        assert_eq!(v["a b"]["app_type"], "hybrid");
        assert_eq!(v["a b"]["image_url"]["md"], "https://img/md/a%20b.jpeg");
        assert!(std::str::from_utf8(&r.json)
            .unwrap()
            .starts_with(r#""a b":{"id":"a b","name":"A","app_type":"hybrid""#));
    }

    #[test]
    fn rejects_bad_data_naming_file_and_entry() {
        assert!(err("{").contains("x.json"));
        assert!(err("[]").contains("x.json"));
        let e = err(r#"{"k1":{"id":"k1","name":"A"},"k2":{"id":"k2"}}"#);
        assert!(
            e.contains("x.json") && e.contains("k2") && e.contains("name"),
            "{e}"
        );
        let e = err(r#"{"k1":{"id":5,"name":"A"}}"#);
        assert!(e.contains("k1") && e.contains("id"), "{e}");
        let e = err(r#"{"k1":{"id":"other","name":"A"}}"#);
        assert!(e.contains("k1") && e.contains("other"), "{e}");
        let e = err(r#"{"k1":{"id":"k1","name":"A"},"k1":{"id":"k1","name":"B"}}"#);
        assert!(e.contains("more than once"), "{e}");
        let e = err(r#"{"k1":"str"}"#);
        assert!(e.contains("k1") && e.contains("object"), "{e}");
        let e = err(r#"{"":{"id":"","name":"A"}}"#);
        assert!(e.contains("empty"), "{e}");
    }

    #[test]
    fn minify_leaves_strings_alone() {
        let mut out = Vec::new();
        minify_into(&mut out, br#"{ "a\" b" : [ "x \\", 1 ] }"#);
        assert_eq!(out, br#"{"a\" b":["x \\",1]}"#);
    }
}
