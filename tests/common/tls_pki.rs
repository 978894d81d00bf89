//! Test PKI for the TLS tests and bench, made on the spot with `rcgen`: a CA, leaf
//! certificates for `localhost` and `127.0.0.1` (ECDSA P-256, or RSA 2048 with a key from
//! the `openssl` command), and a `rustls` client config that trusts the CA. It does not
//! depend on walletrelay, so unit tests, integration tests and benches all include it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    SanType, SerialNumber,
};
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore, SupportedProtocolVersion};

/// A certificate authority for one test.
pub struct TestCa {
    /// The CA certificate, PEM (what `curl --cacert` and Python's `cafile` take).
    pub cert_pem: String,
    /// The CA certificate, DER.
    pub cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

/// A server certificate and its key.
pub struct Leaf {
    /// The chain, PEM: the leaf, then the CA.
    pub chain_pem: String,
    /// The private key, PEM (PKCS#8).
    pub key_pem: String,
    /// The leaf certificate, DER (what a client sees as the peer certificate).
    pub der: CertificateDer<'static>,
}

impl Leaf {
    /// Writes `cert.pem` and `key.pem` into `dir`; returns their paths.
    pub fn write_to(&self, dir: &Path) -> (PathBuf, PathBuf) {
        let cert = dir.join("cert.pem");
        let key = dir.join("key.pem");
        std::fs::write(&cert, &self.chain_pem).unwrap();
        std::fs::write(&key, &self.key_pem).unwrap();
        (cert, key)
    }
}

impl TestCa {
    /// A fresh CA with an ECDSA P-256 key.
    pub fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "walletrelay test CA");
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        TestCa {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf with an ECDSA P-256 key and this serial number (it also names it: CN
    /// `walletrelay test <serial>`).
    pub fn leaf(&self, serial: u64) -> Leaf {
        self.leaf_with_key(serial, KeyPair::generate().unwrap())
    }

    /// A leaf with an RSA 2048 key made by the `openssl` command (`ring` cannot make RSA
    /// keys); `None` without `openssl`.
    pub fn rsa_leaf(&self, serial: u64) -> Option<Leaf> {
        let out = std::process::Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
            ])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        let pem = String::from_utf8(out.stdout).ok()?;
        let key = KeyPair::from_pem_and_sign_algo(&pem, &rcgen::PKCS_RSA_SHA256).ok()?;
        Some(self.leaf_with_key(serial, key))
    }

    fn leaf_with_key(&self, serial: u64, key: KeyPair) -> Leaf {
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        params
            .distinguished_name
            .push(DnType::CommonName, format!("walletrelay test {serial}"));
        params.serial_number = Some(SerialNumber::from(serial));
        params
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ServerAuth);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            chain_pem: format!("{}{}", cert.pem(), self.cert_pem),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }

    /// A `rustls` client config trusting this CA, offering ALPN `http/1.1` and only
    /// `versions`; it keeps sessions for resumption (the default in-memory store).
    pub fn client_config(
        &self,
        versions: &[&'static SupportedProtocolVersion],
    ) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.cert_der.clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }
}
