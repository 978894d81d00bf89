//! SSRF guard: which addresses a webhook may reach, and the name resolver that hands the HTTP
//! client only vetted addresses.
//!
//! The client connects to exactly the addresses [`GuardedResolver`] returns, so there is no
//! second DNS lookup between the check and the connect that a rebinding name could exploit.
//! This module owns no state beyond the `allow_private` switch.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// Whether a webhook must not be called at `ip`: loopback, private (RFC 1918), shared
/// address space (CGNAT, 100.64/10), link-local, unique-local (fc00::/7), site-local,
/// multicast, unspecified, broadcast and other reserved ranges, including IPv4 addresses
/// embedded in IPv6 (mapped, compatible, NAT64, 6to4) and all of Teredo.
pub fn is_forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_forbidden_v4(v4),
        IpAddr::V6(v6) => is_forbidden_v6(v6),
    }
}

fn is_forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    a == 0 // "this network", includes 0.0.0.0
        || a == 10 // private
        || (a == 100 && (b & 0xc0) == 64) // shared address space (CGNAT) 100.64/10
        || a == 127 // loopback
        || (a == 169 && b == 254) // link-local
        || (a == 172 && (b & 0xf0) == 16) // private 172.16/12
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments 192.0.0/24
        || (a == 192 && b == 0 && c == 2) // documentation
        || (a == 192 && b == 168) // private
        || (a == 198 && (b & 0xfe) == 18) // benchmarking 198.18/15
        || (a == 198 && b == 51 && c == 100) // documentation
        || (a == 203 && b == 0 && c == 113) // documentation
        || a >= 224 // multicast 224/4, reserved 240/4, broadcast
}

fn is_forbidden_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    if ip.is_unspecified() || ip.is_loopback() {
        return true;
    }
    if let Some(v4) = embedded_v4(ip) {
        return is_forbidden_v4(v4);
    }
    (s[0] & 0xff00) == 0xff00 // multicast ff00::/8
        || (s[0] & 0xfe00) == 0xfc00 // unique-local fc00::/7
        || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated) fec0::/10
        || (s[0] == 0x2001 && s[1] == 0) // Teredo 2001::/32 tunnels to arbitrary IPv4
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || (s[0] == 0x0064 && s[1] == 0xff9b && s[2] == 1) // local-use NAT64 64:ff9b:1::/48
        || (s[0] == 0x0100 && s[1] == 0 && s[2] == 0 && s[3] == 0) // discard-only 100::/64
}

/// The IPv4 address a v6 address stands for, where the v6 form reaches a v4 host: mapped
/// (`::ffff:a.b.c.d`), compatible (`::a.b.c.d`, deprecated), well-known NAT64
/// (`64:ff9b::a.b.c.d`) and 6to4 (`2002:aabb:ccdd::/48`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if s[..5] == [0; 5] && (s[5] == 0xffff || s[5] == 0) {
        return Some(low);
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(low);
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    None
}

/// The error the resolver reports when every address of a webhook's host is forbidden; the
/// pool recognises it to count the call as `dropped{reason="ssrf"}` instead of failed.
#[derive(Debug, thiserror::Error)]
#[error("webhook host {host} resolves only to forbidden addresses ({first})")]
pub struct SsrfRefused {
    /// The host as written in the webhook address.
    pub host: String,
    /// The first forbidden address it resolved to.
    pub first: IpAddr,
}

/// A [`Resolver`] that resolves like ureq's default (system resolver, within the try's
/// timeout) and then keeps only the addresses a webhook may reach. With `allow_private` it
/// keeps all of them.
pub struct GuardedResolver {
    /// Skip the check (`--webhook-allow-private`).
    pub allow_private: bool,
    inner: DefaultResolver,
}

impl GuardedResolver {
    /// A resolver that refuses forbidden addresses unless `allow_private`.
    pub fn new(allow_private: bool) -> GuardedResolver {
        GuardedResolver {
            allow_private,
            inner: DefaultResolver::default(),
        }
    }
}

impl fmt::Debug for GuardedResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedResolver")
            .field("allow_private", &self.allow_private)
            .finish()
    }
}

impl Resolver for GuardedResolver {
    fn resolve(
        &self,
        uri: &Uri,
        config: &Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        // The system resolver reports a failed lookup as an I/O error; name it for what it is.
        let all = self
            .inner
            .resolve(uri, config, timeout)
            .map_err(|e| match e {
                ureq::Error::Io(_) => ureq::Error::HostNotFound,
                other => other,
            })?;
        if self.allow_private {
            return Ok(all);
        }
        let mut kept = self.empty();
        let mut first = None;
        for addr in all.iter() {
            if is_forbidden(addr.ip()) {
                first.get_or_insert(addr.ip());
            } else {
                kept.push(*addr);
            }
        }
        match first {
            Some(first) if kept.is_empty() => Err(ureq::Error::Other(Box::new(SsrfRefused {
                host: uri.host().unwrap_or_default().to_string(),
                first,
            }))),
            _ => Ok(kept),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden(s: &str) -> bool {
        is_forbidden(s.parse().unwrap_or_else(|e| panic!("{s}: {e}")))
    }

    #[test]
    fn refuses_local_and_special_ranges() {
        for s in [
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "10.255.255.255",
            "100.64.0.1",
            "100.127.255.254",
            "127.0.0.1",
            "127.255.0.9",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.168.1.1",
            "198.18.0.1",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.2.3",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b:1::1",
            "2002:7f00:1::1",
            "2002:c0a8:101::1",
            "2001:0:4136:e378::1",
            "2001:db8::1",
            "100::1",
        ] {
            assert!(forbidden(s), "{s} should be refused");
        }
    }

    #[test]
    fn allows_public_addresses() {
        for s in [
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.1",
            "172.15.255.255",
            "172.32.0.1",
            "192.169.0.1",
            "169.253.1.1",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2a00:1450:4001:80b::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "fbff::1",
            "fe00::1",
        ] {
            assert!(!forbidden(s), "{s} should be allowed");
        }
    }

    fn resolve(allow_private: bool, uri: &str) -> Result<Vec<std::net::SocketAddr>, ureq::Error> {
        let uri: Uri = uri.parse().map_err(|_| ureq::Error::BadUri(uri.into()))?;
        let config = Config::default();
        let timeout = NextTimeout {
            after: std::time::Duration::from_secs(5).into(),
            reason: ureq::Timeout::Resolve,
            ..NextTimeout::default()
        };
        GuardedResolver::new(allow_private)
            .resolve(&uri, &config, timeout)
            .map(|a| a.iter().copied().collect())
    }

    #[test]
    fn resolver_refuses_loopback_literals_and_names() {
        for uri in [
            "http://127.0.0.1:9/x",
            "http://[::1]:9/",
            "https://localhost/",
            "http://0.0.0.0/",
        ] {
            match resolve(false, uri) {
                Err(ureq::Error::Other(e)) => assert!(e.downcast_ref::<SsrfRefused>().is_some()),
                other => panic!("{uri}: {other:?}"),
            }
        }
    }

    #[test]
    fn resolver_with_allow_private_keeps_the_address() {
        let addrs = resolve(true, "http://127.0.0.1:9/x").unwrap_or_default();
        assert_eq!(
            addrs,
            vec!["127.0.0.1:9"
                .parse::<std::net::SocketAddr>()
                .expect("literal")]
        );
    }
}
