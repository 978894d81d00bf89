//! What a connection's bytes mean, for the loop in `net`: the upgrade answer, then
//! WebSocket frames (fragments assembled, pings answered, the close handshake, RSV1
//! messages inflated) handed to the handler as whole messages; an HTTP connection's bytes
//! go to `http`.
//!
//! It does not touch readiness or buffers beyond the connection's own: `socket` reads and
//! keeps what is not consumed.

use std::mem;

use super::{CloseWhy, Handler, Io, Key, Phase, Proto, MAX_MESSAGE, READ_CHUNK};
use crate::{deflate, tls, upgrade, ws};

impl Io {
    /// Consume what can be consumed of `buf`; returns bytes used.
    pub(super) fn process<H: Handler>(
        &mut self,
        h: &mut H,
        key: Key,
        buf: &[u8],
        now: u64,
    ) -> usize {
        let Some(c) = self.conns.get_mut(key) else {
            return buf.len();
        };
        let tag = c.tag;
        match (c.proto, c.phase) {
            (Proto::Ws, Phase::Upgrading) => {
                match upgrade::parse_upgrade_response(buf, self.codec.is_some()) {
                    Ok(None) => 0,
                    Err(e) => {
                        self.mark_dead(key, CloseWhy::Upgrade(e.to_string()));
                        buf.len()
                    }
                    Ok(Some(n)) => {
                        c.phase = Phase::Open;
                        c.deflate = self.codec.is_some();
                        c.plain_from = c.out.len();
                        h.on_open(self, key, tag, now);
                        n + self.frames(h, key, tag, &buf[n..], now)
                    }
                }
            }
            (Proto::Ws, Phase::Open | Phase::Closing) => self.frames(h, key, tag, buf, now),
            (Proto::Http, Phase::Open) => self.http_responses(h, key, tag, buf, now),
            _ => buf.len(),
        }
    }

    fn frames<H: Handler>(&mut self, h: &mut H, key: Key, tag: u32, buf: &[u8], now: u64) -> usize {
        let mut off = 0;
        let deflate = self.conns.get(key).is_some_and(|c| c.deflate);
        while self.alive(key) {
            let head = match ws::parse_head(&buf[off..], MAX_MESSAGE, deflate) {
                Ok(Some(hd)) => hd,
                Ok(None) => return off,
                Err(e) => {
                    self.mark_dead(key, CloseWhy::Protocol(e.to_string()));
                    return buf.len();
                }
            };
            let total = head.head_len + head.payload_len;
            if buf.len() - off < total {
                return off;
            }
            let payload = &buf[off + head.head_len..off + total];
            off += total;
            if head.mask.is_some() {
                self.mark_dead(key, CloseWhy::Protocol("masked server frame".into()));
                return buf.len();
            }
            match head.opcode {
                ws::op::TEXT | ws::op::BINARY => {
                    let Some(c) = self.conns.get_mut(key) else {
                        return buf.len();
                    };
                    if c.frag_active {
                        self.mark_dead(
                            key,
                            CloseWhy::Protocol("new message inside a fragmented one".into()),
                        );
                        return buf.len();
                    }
                    if head.fin {
                        self.deliver(h, key, tag, payload, head.compressed, now);
                    } else {
                        c.frag_active = true;
                        c.frag_compressed = head.compressed;
                        c.frag.extend_from_slice(payload);
                    }
                }
                ws::op::CONT => {
                    let Some(c) = self.conns.get_mut(key) else {
                        return buf.len();
                    };
                    if !c.frag_active {
                        self.mark_dead(
                            key,
                            CloseWhy::Protocol("continuation without a start".into()),
                        );
                        return buf.len();
                    }
                    if c.frag.len() + payload.len() > MAX_MESSAGE {
                        self.mark_dead(key, CloseWhy::Protocol("message too large".into()));
                        return buf.len();
                    }
                    c.frag.extend_from_slice(payload);
                    if head.fin {
                        c.frag_active = false;
                        let compressed = mem::take(&mut c.frag_compressed);
                        let msg = mem::take(&mut c.frag);
                        self.deliver(h, key, tag, &msg, compressed, now);
                    }
                }
                ws::op::PING => {
                    if let Some(c) = self.conns.get_mut(key) {
                        ws::encode_client(&mut c.out, ws::op::PONG, payload);
                        if !c.dirty {
                            c.dirty = true;
                            self.dirty.push(key);
                        }
                        self.stats.pings += 1;
                    }
                }
                ws::op::PONG => h.on_pong(self, key, tag, now),
                _ => {
                    // Close.
                    let code = if payload.len() >= 2 {
                        u16::from_be_bytes([payload[0], payload[1]])
                    } else {
                        1005
                    };
                    let Some(c) = self.conns.get_mut(key) else {
                        return buf.len();
                    };
                    if c.phase == Phase::Closing {
                        self.mark_dead(key, CloseWhy::Normal);
                    } else {
                        // Echo the close, best effort, then drop.
                        let mut echo = Vec::new();
                        ws::encode_close(&mut echo, if code == 1005 { 1000 } else { code });
                        let _ = tls::write(&mut c.stream, c.tls.as_deref_mut(), &echo);
                        self.mark_dead(key, CloseWhy::ServerClose(code));
                    }
                    return buf.len();
                }
            }
        }
        buf.len()
    }

    /// Hands one whole message to the handler, inflating it first if it came compressed.
    fn deliver<H: Handler>(
        &mut self,
        h: &mut H,
        key: Key,
        tag: u32,
        payload: &[u8],
        compressed: bool,
        now: u64,
    ) {
        self.stats.wire.messages_in += 1;
        if !compressed {
            h.on_message(self, key, tag, payload, now);
            return;
        }
        self.stats.wire.compressed_in += 1;
        let mut msg = mem::take(&mut self.inflated);
        let inflated = match self.codec.as_deref_mut() {
            Some(codec) => codec.inflate(payload, MAX_MESSAGE, &mut msg),
            None => Err(deflate::InflateError::Invalid),
        };
        match inflated {
            Ok(()) => h.on_message(self, key, tag, &msg, now),
            Err(e) => self.mark_dead(key, CloseWhy::Protocol(e.to_string())),
        }
        if msg.capacity() <= READ_CHUNK {
            self.inflated = msg;
        }
    }
}
