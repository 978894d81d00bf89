//! Addresses blocked at the listener: the escalation of the accept limits of DECISIONS §11
//! for a connection storm (docs/TUNING.md, "Blocking a storm at the listener").
//!
//! Closing a refused connection at accept is not free: the kernel completes its TCP
//! handshake, and the worker accepts it and closes it again, on the loop that serves
//! everyone else (about half of a worker's time under a storm of 20,000 refused
//! connections a second, docs/RELIABILITY-abuse.md). An address refused at accept
//! `--accept-block-after` times within one second is therefore blocked for `--accept-block-ms`
//! (twice as long for each block that follows the last within its length, `limits::on_accept`):
//! its packets to the listening socket (its SYNs) are dropped by a classic BPF filter on the
//! worker's listeners, so the kernel answers nothing and queues nothing, and the client's
//! own SYN retransmission (1 s, then 3 s, 7 s, ...) paces it. Connections it already has
//! are not affected (a filter applies to the socket it is attached to; an accepted socket
//! keeps the filter the listener had when it was made, which only matches blocked
//! addresses).
//!
//! This module owns the bounded list ([`Blocks`], at most [`MAX_BLOCKED`] addresses per
//! worker: a storm from more addresses than that is still refused at accept, only not as
//! cheaply) and the program ([`Blocks::program`]); attaching it to the sockets is the
//! worker's.

use crate::ip;

/// Addresses (IPv6: /64s) one worker blocks at once.
pub const MAX_BLOCKED: usize = 64;

/// One instruction of a classic BPF program (`struct sock_filter`).
pub type Insn = libc::sock_filter;

/// The blocked addresses of one worker, with when each block ends.
#[derive(Debug, Default)]
pub struct Blocks {
    /// (address key as `ip::ip_key` makes it, end of the block in ms).
    list: Vec<(u128, u64)>,
    /// The list changed since the program was last taken.
    changed: bool,
}

impl Blocks {
    /// Blocks `key` until `until`; `false` when it already was or the list is full.
    pub fn add(&mut self, key: u128, until: u64) -> bool {
        if self.list.len() >= MAX_BLOCKED || self.list.iter().any(|&(k, _)| k == key) {
            return false;
        }
        self.list.push((key, until));
        self.changed = true;
        true
    }

    /// Ends the blocks due at `now`.
    pub fn expire(&mut self, now: u64) {
        let before = self.list.len();
        self.list.retain(|&(_, until)| until > now);
        self.changed |= self.list.len() != before;
    }

    /// Addresses blocked now.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The program for the listeners if the list changed since the last call: `Some(empty)`
    /// means no filter at all.
    pub fn take_change(&mut self) -> Option<Vec<Insn>> {
        if !std::mem::take(&mut self.changed) {
            return None;
        }
        if self.list.is_empty() {
            return Some(Vec::new());
        }
        Some(self.program())
    }

    /// A program that drops a packet whose source is in the list and lets every other one
    /// through: IPv4 sources are compared whole, IPv6 ones by their first 64 bits (the
    /// version nibble of the IP header says which). Every conditional jump is short (at
    /// most 3 ahead); the long ones are `ja`, whose offset has 32 bits, so the program is
    /// valid whatever the list's length.
    pub fn program(&self) -> Vec<Insn> {
        let v4: Vec<u32> = self
            .list
            .iter()
            .filter(|&&(k, _)| ip::key_is_v4(k))
            .map(|&(k, _)| k as u32)
            .collect();
        let v6: Vec<(u32, u32)> = self
            .list
            .iter()
            .filter(|&&(k, _)| !ip::key_is_v4(k))
            .map(|&(k, _)| ((k >> 96) as u32, (k >> 64) as u32))
            .collect();
        let mut p = vec![
            stmt(LD | B | ABS, NET),
            stmt(ALU | RSH | K, 4),
            jump(JEQ, 4, 0, 1),
            stmt(JMP | JA, 3), // to the IPv4 part
            jump(JEQ, 6, 0, 1),
            stmt(JMP | JA, 1 + 2 * v4.len() as u32 + 2), // to the IPv6 part
            stmt(RET | K, PASS),
        ];
        // IPv4: the source address is at 12 in the header.
        p.push(stmt(LD | W | ABS, NET + 12));
        for a in v4 {
            p.push(jump(JEQ, a, 0, 1));
            p.push(stmt(RET | K, DROP));
        }
        p.push(stmt(RET | K, PASS));
        // IPv6: the source address is at 8; its /64 is the words at 8 and 12.
        p.push(stmt(LD | W | ABS, NET + 8));
        p.push(stmt(ST, 0));
        p.push(stmt(LD | W | ABS, NET + 12));
        p.push(stmt(ST, 1));
        for (hi, lo) in v6 {
            p.push(stmt(LD | MEM, 0));
            p.push(jump(JEQ, hi, 0, 3));
            p.push(stmt(LD | MEM, 1));
            p.push(jump(JEQ, lo, 0, 1));
            p.push(stmt(RET | K, DROP));
        }
        p.push(stmt(RET | K, PASS));
        p
    }
}

// Classic BPF (linux/filter.h, linux/bpf_common.h).
const LD: u16 = 0x00;
const ST: u16 = 0x02;
const ALU: u16 = 0x04;
const JMP: u16 = 0x05;
const RET: u16 = 0x06;
const W: u16 = 0x00;
const B: u16 = 0x10;
const ABS: u16 = 0x20;
const MEM: u16 = 0x60;
const RSH: u16 = 0x70;
const JA: u16 = 0x00;
const JEQ: u16 = 0x10;
const K: u16 = 0x00;
/// `SKF_NET_OFF`: offsets from it are from the start of the IP header.
const NET: u32 = (-0x10_0000i32) as u32;
/// Keep the whole packet.
const PASS: u32 = u32::MAX;
/// Drop it.
const DROP: u32 = 0;

fn stmt(code: u16, k: u32) -> Insn {
    Insn {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(op: u16, k: u32, jt: u8, jf: u8) -> Insn {
    Insn {
        code: JMP | op | K,
        jt,
        jf,
        k,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    /// Runs `p` on an IP header the way the kernel's classic BPF interpreter would (the
    /// instructions this module emits only): `true` when the packet is kept.
    fn run(p: &[Insn], header: &[u8]) -> bool {
        let word = |off: u32| {
            let at = off.wrapping_sub(NET) as usize;
            u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
        };
        let (mut a, mut mem, mut pc) = (0u32, [0u32; 16], 0usize);
        loop {
            let i = p[pc];
            pc += 1;
            match i.code {
                c if c == LD | B | ABS => a = u32::from(header[i.k.wrapping_sub(NET) as usize]),
                c if c == LD | W | ABS => a = word(i.k),
                c if c == LD | MEM => a = mem[i.k as usize],
                c if c == ST => mem[i.k as usize] = a,
                c if c == ALU | RSH | K => a >>= i.k,
                c if c == JMP | JA => pc += i.k as usize,
                c if c == JMP | JEQ | K => {
                    pc += usize::from(if a == i.k { i.jt } else { i.jf });
                }
                c if c == RET | K => return i.k != 0,
                c => panic!("unexpected opcode {c:#x}"),
            }
        }
    }

    fn header(src: IpAddr) -> Vec<u8> {
        match src {
            IpAddr::V4(v4) => {
                let mut h = vec![0x45; 20];
                h[12..16].copy_from_slice(&v4.octets());
                h
            }
            IpAddr::V6(v6) => {
                let mut h = vec![0x60; 40];
                h[8..24].copy_from_slice(&v6.octets());
                h
            }
        }
    }

    fn key(s: &str) -> u128 {
        ip::ip_key(s.parse().unwrap())
    }

    fn kept(b: &Blocks, src: &str) -> bool {
        run(&b.program(), &header(src.parse().unwrap()))
    }

    #[test]
    fn drops_blocked_addresses_and_keeps_the_others() {
        let mut b = Blocks::default();
        assert!(kept(&b, "10.0.0.1") && kept(&b, "2001:db8::1"));
        assert!(b.add(key("10.0.0.1"), 100));
        assert!(b.add(key("2001:db8:0:1::5"), 100));
        assert!(!kept(&b, "10.0.0.1"));
        assert!(kept(&b, "10.0.0.2") && kept(&b, "11.0.0.1"));
        // IPv6 by /64.
        assert!(!kept(&b, "2001:db8:0:1::9") && !kept(&b, "2001:db8:0:1:ffff::"));
        assert!(kept(&b, "2001:db8:0:2::5") && kept(&b, "2001:db9:0:1::5"));
        // An IPv4 address and an IPv6 one whose words look alike do not match each other.
        assert!(kept(&b, "::a00:1"));
    }

    #[test]
    fn a_full_list_works_and_is_bounded() {
        let mut b = Blocks::default();
        for i in 0..MAX_BLOCKED as u32 / 2 {
            assert!(b.add(key(&format!("10.1.{}.{}", i / 256, i % 256)), 100));
            assert!(b.add(key(&format!("2001:db8:{i:x}::1")), 100));
        }
        assert!(!b.add(key("10.9.9.9"), 100), "full");
        assert_eq!(b.len(), MAX_BLOCKED);
        let p = b.program();
        assert!(p.len() <= 4096, "BPF_MAXINSNS");
        for i in 0..MAX_BLOCKED as u32 / 2 {
            assert!(!kept(&b, &format!("10.1.{}.{}", i / 256, i % 256)));
            assert!(!kept(&b, &format!("2001:db8:{i:x}::77")));
        }
        assert!(kept(&b, "10.9.9.9") && kept(&b, "2001:db8:ffff::1"));
    }

    #[test]
    fn blocks_end_and_each_change_gives_one_program() {
        let mut b = Blocks::default();
        assert!(b.take_change().is_none());
        b.add(key("10.0.0.1"), 100);
        assert!(!b.add(key("10.0.0.1"), 200), "already blocked");
        assert!(b.take_change().is_some_and(|p| !p.is_empty()));
        assert!(b.take_change().is_none());
        b.expire(99);
        assert!(b.take_change().is_none(), "not due yet");
        b.expire(100);
        assert!(b.is_empty());
        assert!(b.take_change().is_some_and(|p| p.is_empty()), "no filter");
    }
}
