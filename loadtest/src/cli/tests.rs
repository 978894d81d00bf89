//! Unit tests of the address rule and durations.

use super::*;

#[test]
fn accepts_loopback_forms() {
    let t = parse_target("ws://127.0.0.1:8080/", Reach::Loopback).unwrap();
    assert_eq!(t.addr, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(t.path, "/");
    assert_eq!(t.host, "127.0.0.1:8080");
    let t = parse_target("ws://127.9.8.7:1/?protocol=wc&version=2", Reach::Loopback).unwrap();
    assert_eq!(t.path, "/?protocol=wc&version=2");
    let t = parse_target("ws://localhost", Reach::Loopback).unwrap();
    assert_eq!(t.addr, "127.0.0.1:80".parse().unwrap());
    let t = parse_target("http://[::1]:9000", Reach::Loopback).unwrap();
    assert_eq!(t.addr, "[::1]:9000".parse().unwrap());
    let t = parse_target("ws://127.0.0.1:81?x=1", Reach::Loopback).unwrap();
    assert_eq!(t.path, "/?x=1");
}

#[test]
fn refuses_everything_else() {
    for url in [
        "ws://10.0.0.1:8080/",
        "ws://192.168.1.1/",
        "ws://8.8.8.8/",
        "ws://example.com/",
        "ws://[2001:db8::1]:80/",
        "ws://0.0.0.0:8080/",
        "ws://128.0.0.1/",
        "ws://localhost.example.com/",
    ] {
        assert!(
            matches!(
                parse_target(url, Reach::Loopback),
                Err(UrlError::NotLoopback(_))
            ),
            "{url}"
        );
    }
    let t = parse_target("wss://localhost:9443/?protocol=wc", Reach::Loopback).unwrap();
    assert_eq!(t.addr, "127.0.0.1:9443".parse().unwrap());
    assert_eq!(t.tls_name.as_deref(), Some("localhost"));
    let t = parse_target("https://[::1]", Reach::Loopback).unwrap();
    assert_eq!(t.addr, "[::1]:443".parse().unwrap());
    assert_eq!(t.tls_name.as_deref(), Some("::1"));
    assert_eq!(
        parse_target("ws://127.0.0.1/", Reach::Loopback)
            .unwrap()
            .tls_name,
        None
    );
    assert!(matches!(
        parse_target("wss://10.0.0.1/", Reach::Loopback),
        Err(UrlError::NotLoopback(_))
    ));
    assert!(matches!(
        parse_target("ftp://127.0.0.1/", Reach::Loopback),
        Err(UrlError::Scheme(_))
    ));
    assert!(matches!(
        parse_target("ws://127.0.0.1:x/", Reach::Loopback),
        Err(UrlError::Malformed(_))
    ));
    assert!(matches!(
        parse_target("ws://user@127.0.0.1/", Reach::Loopback),
        Err(UrlError::Malformed(_))
    ));
}

#[test]
fn durations() {
    assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
    assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
    assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
    assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
    assert!(parse_duration("-1s").is_err());
    assert!(parse_duration("abc").is_err());
}

#[test]
fn storm_defaults_are_the_sdk_shape() {
    let cli = Cli::try_parse_from(["loadtest", "storm", "--auth", "--reconnect", "sdk"]).unwrap();
    let Command::Storm(o) = cli.cmd else {
        panic!("not storm");
    };
    assert!(o.common.auth);
    assert_eq!(o.protocol, RelayProtocol::Irn);
    assert_eq!(o.topics, 2);
    assert_eq!(o.reconnect, Reconnect::Sdk);
    assert!(!o.fetch && !o.reuse_token);
    assert!(Cli::try_parse_from(["loadtest", "storm", "--reconnect", "later"]).is_err());
}

#[test]
fn remote_needs_the_flag_and_an_address() {
    let t = parse_target("ws://10.213.7.14:9000/", Reach::Remote).unwrap();
    assert_eq!(t.addr, "10.213.7.14:9000".parse().unwrap());
    assert!(parse_target("ws://[2001:db8::1]:80/", Reach::Remote).is_ok());
    assert!(parse_target("ws://127.0.0.1:80/", Reach::Remote).is_ok());
    assert!(matches!(
        parse_target("ws://example.com/", Reach::Remote),
        Err(UrlError::Name(_))
    ));
    let accepted: Vec<&str> = [
        "ws://0.0.0.0/",
        "ws://224.0.0.1/",
        "ws://255.255.255.255/",
        "ws://[::]/",
    ]
    .into_iter()
    .filter(|u| !matches!(parse_target(u, Reach::Remote), Err(UrlError::NotUnicast(_))))
    .collect();
    assert!(accepted.is_empty(), "{accepted:?}");
}

#[test]
fn lab_flags_parse() {
    let cli = Cli::try_parse_from([
        "loadtest",
        "pairs",
        "--allow-remote",
        "--start-at",
        "1796284800.25",
        "--hlog",
        "/tmp/a.hlog",
    ])
    .unwrap();
    let Command::Pairs(o) = cli.cmd else {
        panic!("not pairs");
    };
    assert!(o.common.allow_remote);
    assert_eq!(o.common.start_at, Some(1_796_284_800_250_000_000));
    assert_eq!(
        o.common.hlog.as_deref(),
        Some(std::path::Path::new("/tmp/a.hlog"))
    );
    assert!(Cli::try_parse_from(["loadtest", "pairs", "--start-at", "soon"]).is_err());
    assert!(Cli::try_parse_from(["loadtest", "merge"]).is_err());
    let cli = Cli::try_parse_from(["loadtest", "merge", "a", "b", "--out", "m"]).unwrap();
    assert!(matches!(cli.cmd, Command::Merge(m) if m.logs.len() == 2));
}
