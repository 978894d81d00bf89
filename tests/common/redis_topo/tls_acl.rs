//! [`RedisTlsAcl`]: one `redis-server` that speaks only TLS (`--port 0 --tls-port P`), with
//! a certificate from a CA made for it, and an ACL file in which the default user is off and
//! user `relay` has a password: a managed Redis as a node meets it (`rediss://`).

use std::net::TcpStream;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    SanType,
};

use super::{redis_cli, Proc};

/// The ACL user the relay logs in as.
pub const USER: &str = "relay";

/// A TLS-only Redis with an ACL user, killed on drop.
pub struct RedisTlsAcl {
    proc: Proc,
    password: String,
    ca: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    password_file: PathBuf,
}

/// The files of a fresh test PKI: a CA, a server certificate for `127.0.0.1` and
/// `localhost`, and a client certificate, all ECDSA P-256.
struct Pki {
    ca_pem: String,
    server: (String, String),
    client: (String, String),
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "walletrelay redis test CA");
    params
}

impl Pki {
    fn new() -> Pki {
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca_params().self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params(), ca_key);
        let leaf = |cn: &str, usage: ExtendedKeyUsagePurpose| {
            let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
            params
                .subject_alt_names
                .push(SanType::IpAddress([127, 0, 0, 1].into()));
            params.distinguished_name.push(DnType::CommonName, cn);
            params.extended_key_usages.push(usage);
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &issuer).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        Pki {
            server: leaf("redis test server", ExtendedKeyUsagePurpose::ServerAuth),
            client: leaf("redis test client", ExtendedKeyUsagePurpose::ClientAuth),
            ca_pem: ca_cert.pem(),
        }
    }
}

/// Whether something accepts TCP connections on the port (the TLS port answers nothing in
/// plain text).
fn listening(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

impl RedisTlsAcl {
    /// A server that accepts clients with or without a certificate
    /// (`--tls-auth-clients optional`).
    pub fn start() -> RedisTlsAcl {
        Self::launch("optional")
    }

    /// A server that requires a client certificate signed by its CA
    /// (`--tls-auth-clients yes`).
    pub fn start_mutual() -> RedisTlsAcl {
        Self::launch("yes")
    }

    fn launch(auth_clients: &'static str) -> RedisTlsAcl {
        let pki = Pki::new();
        let password = super::super::hex(32, seed());
        let mut files = None;
        let proc = Proc::start(
            "redis-tls",
            |port, dir| {
                let write = |name: &str, text: &str| {
                    let p = dir.join(name);
                    std::fs::write(&p, text).expect("write a TLS test file");
                    p.display().to_string()
                };
                let ca = write("ca.pem", &pki.ca_pem);
                let cert = write("server.pem", &pki.server.0);
                let key = write("server.key", &pki.server.1);
                let client_cert = write("client.pem", &pki.client.0);
                let client_key = write("client.key", &pki.client.1);
                // As an operator writes it: with a newline at the end.
                let password_file = write("password", &format!("{password}\n"));
                let acl = write(
                    "users.acl",
                    &format!("user default off\nuser {USER} on >{password} ~* &* +@all\n"),
                );
                files = Some((ca.clone(), client_cert, client_key, password_file));
                [
                    "--port",
                    "0",
                    "--tls-port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--tls-cert-file",
                    &cert,
                    "--tls-key-file",
                    &key,
                    "--tls-ca-cert-file",
                    &ca,
                    "--tls-auth-clients",
                    auth_clients,
                    "--aclfile",
                    &acl,
                    "--dir",
                    &dir.display().to_string(),
                    "--logfile",
                    "redis.log",
                ]
                .map(String::from)
                .to_vec()
            },
            listening,
        );
        let (ca, client_cert, client_key, password_file) = files.expect("files written");
        let r = RedisTlsAcl {
            proc,
            password,
            ca: ca.into(),
            client_cert: client_cert.into(),
            client_key: client_key.into(),
            password_file: password_file.into(),
        };
        let pong = r.try_cli(&["PING"]);
        assert_eq!(
            pong.as_deref().map(str::trim),
            Ok("PONG"),
            "the TLS Redis does not answer; its log:\n{}",
            r.proc.log_tail(20)
        );
        r
    }

    /// Its TLS port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.proc.port
    }

    /// `rediss://relay:PASSWORD@127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        self.url_with_password(&self.password)
    }

    /// The URL with another password (a wrong one, for the refusal tests).
    pub fn url_with_password(&self, password: &str) -> String {
        format!("rediss://{USER}:{password}@127.0.0.1:{}/0", self.port())
    }

    /// The URL with the user and no password (`--redis-password-file` gives it).
    pub fn url_without_password(&self) -> String {
        format!("rediss://{USER}@127.0.0.1:{}/0", self.port())
    }

    /// User `relay`'s password (32 hex characters, fresh per server).
    pub fn password(&self) -> &str {
        &self.password
    }

    /// A file holding the password and a newline (`--redis-password-file`).
    pub fn password_file(&self) -> &Path {
        &self.password_file
    }

    /// The CA's certificate, PEM (`--redis-tls-ca`).
    pub fn ca_path(&self) -> &Path {
        &self.ca
    }

    /// A client certificate signed by the CA, PEM (`--redis-tls-cert`).
    pub fn client_cert_path(&self) -> &Path {
        &self.client_cert
    }

    /// The client certificate's key, PEM PKCS#8 (`--redis-tls-key`).
    pub fn client_key_path(&self) -> &Path {
        &self.client_key
    }

    /// Runs one command as `relay` (with the client certificate) through `redis-cli --tls`;
    /// its raw output, or what went wrong.
    pub fn try_cli(&self, args: &[&str]) -> Result<String, String> {
        self.cli_as(Some((USER, &self.password)), args)
    }

    /// [`RedisTlsAcl::try_cli`], failing the test on an error.
    pub fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args)
            .unwrap_or_else(|e| panic!("{args:?} on the TLS Redis: {e}"))
    }

    /// Runs one command through `redis-cli --tls` as `user` (`None`: no `AUTH` at all).
    pub fn cli_as(&self, user: Option<(&str, &str)>, args: &[&str]) -> Result<String, String> {
        let path = |p: &Path| p.display().to_string();
        let mut a: Vec<String> = vec![
            "--tls".into(),
            "--cacert".into(),
            path(&self.ca),
            "--cert".into(),
            path(&self.client_cert),
            "--key".into(),
            path(&self.client_key),
            "-h".into(),
            "127.0.0.1".into(),
            "-p".into(),
            self.port().to_string(),
            "--no-auth-warning".into(),
        ];
        if let Some((u, p)) = user {
            a.extend(["--user".into(), u.into(), "--pass".into(), p.into()]);
        }
        a.push("-e".into());
        a.extend(args.iter().map(|s| s.to_string()));
        redis_cli(&a)
    }

    /// Whether it answers `PING` (as `relay`).
    pub fn ping(&self) -> bool {
        self.try_cli(&["PING"]).is_ok_and(|p| p.trim() == "PONG")
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// `SIGKILL` and reap.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Starts it again (same port, files and password; no persistence).
    pub fn restart(&mut self) {
        self.proc.restart();
    }

    /// The last lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        self.proc.log_tail(n)
    }
}

/// A seed that differs per call and per process (for the password).
fn seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    t ^ (u64::from(std::process::id()) << 32) ^ N.fetch_add(0x9e37_79b9, Ordering::Relaxed) | 1
}
