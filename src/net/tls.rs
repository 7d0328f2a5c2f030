//! rustls configuration from PEM files: the data listener's server config (optionally
//! requiring client certificates) and the upstream client config.
//!
//! The ring provider is named explicitly so the choice never depends on which crypto
//! features other crates happen to enable.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read PEM {what} from {path}: {source}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("no certificate found in {path}")]
    NoCertificate { path: PathBuf },
    #[error("invalid TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("invalid client CA {path}: {source}")]
    ClientCa {
        path: PathBuf,
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|source| TlsError::Pem {
            what: "certificates",
            path: path.into(),
            source,
        })?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            what: "certificates",
            path: path.into(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { path: path.into() });
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| TlsError::Pem {
        what: "private key",
        path: path.into(),
        source,
    })
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path)? {
        roots.add(cert)?;
    }
    Ok(roots)
}

/// Server config for the data listener; `alpn` lists the protocols offered (h2 first when
/// HTTP/2 is on).
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    alpn: &[&[u8]],
) -> Result<ServerConfig, TlsError> {
    let builder =
        ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                    .build()
                    .map_err(|source| TlsError::ClientCa {
                        path: ca.into(),
                        source,
                    })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certificates(cert)?, private_key(key)?)?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// Client config for an https:// upstream: the given CA (else the public web roots) and an
/// optional client certificate.
pub fn client_config(
    ca: Option<&Path>,
    client_cert: Option<(&Path, &Path)>,
) -> Result<ClientConfig, TlsError> {
    let roots = match ca {
        Some(ca) => roots(ca)?,
        None => RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        },
    };
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    Ok(match client_cert {
        Some((cert, key)) => {
            builder.with_client_auth_cert(certificates(cert)?, private_key(key)?)?
        }
        None => builder.with_no_client_auth(),
    })
}
