//! RESP, the Redis protocol, at its simplest: packing commands as arrays of bulk strings
//! ([`Packer`], a whole pipeline in one buffer) and reading a number or a string out of a
//! reply. A leaf: every other file of `cluster` may use it, it uses none of them.

use redis::Value;

/// Appends RESP arrays of bulk strings to a buffer (a pipeline of commands).
pub struct Packer<'a> {
    buf: &'a mut Vec<u8>,
}

impl<'a> Packer<'a> {
    /// Packs into `buf` (appending).
    pub fn new(buf: &'a mut Vec<u8>) -> Self {
        Packer { buf }
    }

    fn head(&mut self, c: u8, n: usize) {
        self.buf.push(c);
        let mut b = itoa::Buffer::new();
        self.buf.extend_from_slice(b.format(n).as_bytes());
        self.buf.extend_from_slice(b"\r\n");
    }

    /// Starts a command of `n` arguments (the command name counts).
    pub fn cmd(&mut self, n: usize) -> &mut Self {
        self.head(b'*', n);
        self
    }

    /// One argument made of `parts` concatenated (a key = prefix + topic, without a copy).
    pub fn arg_parts(&mut self, parts: &[&[u8]]) -> &mut Self {
        self.head(b'$', parts.iter().map(|p| p.len()).sum());
        for p in parts {
            self.buf.extend_from_slice(p);
        }
        self.buf.extend_from_slice(b"\r\n");
        self
    }

    /// One argument.
    pub fn arg(&mut self, a: &[u8]) -> &mut Self {
        self.arg_parts(&[a])
    }

    /// One unsigned integer argument, in decimal.
    pub fn num(&mut self, n: u64) -> &mut Self {
        let mut b = itoa::Buffer::new();
        let s = b.format(n);
        self.arg_parts(&[s.as_bytes()])
    }
}

/// A bulk or simple string reply as text.
pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// An integer reply (or a string holding one).
pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        v => text(v).and_then(|s| s.parse().ok()),
    }
}

/// Test helpers of the modules that pack commands.
#[cfg(test)]
#[allow(clippy::panic, clippy::unwrap_used)]
pub(crate) mod tests {
    use redis::Value;

    /// The bulk strings of one packed command, as Redis reads them.
    pub(crate) fn strings(buf: &[u8]) -> Vec<Vec<u8>> {
        let Value::Array(a) = redis::parse_redis_value(buf).unwrap() else {
            panic!("not an array")
        };
        a.into_iter()
            .map(|x| match x {
                Value::BulkString(b) => b,
                other => panic!("{other:?}"),
            })
            .collect()
    }
}
