//! Client addresses as the limits see them: [`ip_key`] (an IPv4 address, or an IPv6 address's
//! /64, as one `u128`), [`Cidr`] ranges (`--limit-exempt`, `--trusted-proxies`: parsed by
//! `config`, checked by `limits`) and the client address a trusted proxy forwards in
//! `X-Forwarded-For` ([`forwarded_client`]).
//! Pure functions: no state, no I/O; a leaf under both `config` and `limits`.

use std::net::IpAddr;
use std::str::FromStr;

/// The 128-bit form of an address: IPv4 (and IPv4-mapped IPv6) as `::ffff:a.b.c.d`.
fn bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => u128::from(v4.to_ipv6_mapped()),
            None => u128::from(v6),
        },
    }
}

/// Whether a 128-bit address is an IPv4 one.
fn is_v4(b: u128) -> bool {
    b >> 32 == 0xffff
}

/// Whether a key of [`ip_key`] is an IPv4 address (its low 32 bits) rather than an IPv6 /64
/// (its high 64 bits).
pub fn key_is_v4(key: u128) -> bool {
    is_v4(key)
}

/// The key an address is counted under: an IPv4 address itself, an IPv6 address's /64
/// (one subscriber line usually gets a whole /64, so counting single IPv6 addresses would
/// let one client take 2^64 of them).
pub fn ip_key(ip: IpAddr) -> u128 {
    let b = bits(ip);
    if is_v4(b) {
        b
    } else {
        b & !((1u128 << 64) - 1)
    }
}

/// An address range (`10.0.0.0/8`, `2001:db8::/32`, or one address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    /// The network, in the 128-bit form.
    net: u128,
    /// The mask, in the 128-bit form.
    mask: u128,
}

/// A `--limit-exempt` / `--trusted-proxies` entry that is not an address range.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid address range {0:?} (expected ADDR or ADDR/PREFIX)")]
pub struct BadCidr(pub String);

impl FromStr for Cidr {
    type Err = BadCidr;

    fn from_str(s: &str) -> Result<Cidr, BadCidr> {
        let bad = || BadCidr(s.to_string());
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p.parse::<u32>().map_err(|_| bad())?)),
            None => (s, None),
        };
        let ip: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        if prefix > max {
            return Err(bad());
        }
        // In the 128-bit form an IPv4 prefix sits below the 96 bits of `::ffff:`.
        let len = prefix + (128 - max);
        let mask = match len {
            0 => 0,
            n => u128::MAX << (128 - n),
        };
        Ok(Cidr {
            net: bits(ip) & mask,
            mask,
        })
    }
}

impl Cidr {
    /// Whether `ip` is in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        bits(ip) & self.mask == self.net
    }
}

/// Whether any range of `list` holds `ip`.
pub fn any_contains(list: &[Cidr], ip: IpAddr) -> bool {
    list.iter().any(|c| c.contains(ip))
}

/// The client address of an `X-Forwarded-For` value (`client, proxy1, proxy2`): the last
/// address that is not itself one of the `trusted` proxies (what comes before it could be
/// written by the client). `None` when there is none (no header, garbage, all trusted).
pub fn forwarded_client(header: &[u8], trusted: &[Cidr]) -> Option<IpAddr> {
    let text = std::str::from_utf8(header).ok()?;
    for part in text.rsplit(',') {
        let ip = parse_forwarded(part.trim())?;
        if !any_contains(trusted, ip) {
            return Some(ip);
        }
    }
    None
}

/// One `X-Forwarded-For` element: an address, `[v6]` or `[v6]:port`, or `v4:port`.
fn parse_forwarded(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok();
    }
    let (host, _port) = s.rsplit_once(':')?;
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv6_counts_per_64_and_ipv4_per_address() {
        assert_eq!(
            ip_key(ip("2001:db8:1:2::1")),
            ip_key(ip("2001:db8:1:2:ffff::9"))
        );
        assert_ne!(ip_key(ip("2001:db8:1:2::1")), ip_key(ip("2001:db8:1:3::1")));
        assert_ne!(ip_key(ip("10.0.0.1")), ip_key(ip("10.0.0.2")));
        assert_eq!(ip_key(ip("10.0.0.1")), ip_key(ip("::ffff:10.0.0.1")));
    }

    #[test]
    fn ranges() {
        let c: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(c.contains(ip("10.1.2.3")) && c.contains(ip("::ffff:10.9.9.9")));
        assert!(!c.contains(ip("11.0.0.1")) && !c.contains(ip("2001:db8::1")));
        let one: Cidr = "127.0.0.2".parse().unwrap();
        assert!(one.contains(ip("127.0.0.2")) && !one.contains(ip("127.0.0.3")));
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")) && !v6.contains(ip("2001:db9::1")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("1.2.3.4")) && !all.contains(ip("2001:db8::1")));
        let all6: Cidr = "::/0".parse().unwrap();
        assert!(all6.contains(ip("2001:db8::1")) && all6.contains(ip("1.2.3.4")));
        for bad in ["10.0.0.0/33", "x", "10.0.0.0/", "::/129", ""] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn forwarded_for_takes_the_last_untrusted_address() {
        let trusted: Vec<Cidr> = vec!["10.0.0.0/8".parse().unwrap()];
        let f = |h: &str| forwarded_client(h.as_bytes(), &trusted);
        assert_eq!(f("1.2.3.4"), Some(ip("1.2.3.4")));
        // A client may write anything in front: the address our proxy saw is the last one.
        assert_eq!(f("6.6.6.6, 1.2.3.4"), Some(ip("1.2.3.4")));
        assert_eq!(f("6.6.6.6, 1.2.3.4, 10.0.0.7"), Some(ip("1.2.3.4")));
        assert_eq!(f("10.0.0.1, 10.0.0.2"), None);
        assert_eq!(f("[2001:db8::1]:443"), Some(ip("2001:db8::1")));
        assert_eq!(f("1.2.3.4:5678"), Some(ip("1.2.3.4")));
        assert_eq!(f("garbage, 1.2.3.4"), Some(ip("1.2.3.4")));
        assert_eq!(f("1.2.3.4, garbage"), None);
        assert_eq!(f(""), None);
        assert_eq!(forwarded_client(&[0xff, 0xfe], &trusted), None);
    }
}
