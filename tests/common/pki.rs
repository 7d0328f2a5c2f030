//! A throwaway certificate authority for the TLS tests: a CA, a server certificate for
//! 127.0.0.1/localhost and a client certificate, as PEM files in a temporary directory.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "shared fixtures: each test binary uses part of them; a test fails loudly on what it asserts"
)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A throwaway CA, a server certificate for 127.0.0.1/localhost and a client certificate.
pub struct Pki {
    dir: PathBuf,
}

impl Pki {
    pub fn new(name: &str) -> Self {
        // One directory per Pki, however many tests of the binary make one at once.
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tokentap-tls-{name}-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        for (stem, names) in [
            (
                "server",
                vec!["127.0.0.1".to_string(), "localhost".to_string()],
            ),
            ("client", vec!["client".to_string()]),
        ] {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(names)
                .unwrap()
                .signed_by(&key, &ca)
                .unwrap();
            std::fs::write(dir.join(format!("{stem}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.join(format!("{stem}.key")), key.serialize_pem()).unwrap();
        }
        Self { dir }
    }

    pub fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    pub fn client_config(&self, with_cert: bool, alpn: &[&[u8]]) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(self.dir.join("ca.pem")).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
        let mut config = if with_cert {
            let certs = CertificateDer::pem_file_iter(self.dir.join("client.pem"))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let key = PrivateKeyDer::from_pem_file(self.dir.join("client.key")).unwrap();
            builder.with_client_auth_cert(certs, key).unwrap()
        } else {
            builder.with_no_client_auth()
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        config
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TLS acceptor for the server certificate, offering `alpn`.
pub fn acceptor(pki: &Pki, alpn: &[&[u8]]) -> tokio_rustls::TlsAcceptor {
    let config = tokentap::net::tls::server_config(
        Path::new(&pki.path("server.pem")),
        Path::new(&pki.path("server.key")),
        None,
        alpn,
    )
    .unwrap();
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}
