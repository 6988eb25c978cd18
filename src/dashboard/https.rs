//! HTTPS on the dashboard's own listener (`dashboard.tls_cert_file` and
//! `dashboard.tls_key_file`), for operators without a proxy in front.
//!
//! The connections themselves, the handshake's deadline among their
//! limits, are [`super::server`]'s. [`ClientAddr`] is a connection's peer
//! address, plain or TLS.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The server configuration from PEM files; the error is one line naming
/// the file.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("dashboard.tls_cert_file {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "dashboard.tls_cert_file {}: holds no PEM certificate",
            cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("dashboard.tls_key_file {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("dashboard.tls_cert_file and tls_key_file: {e}"))?;
    Ok(Arc::new(config))
}

/// The peer address of a dashboard connection, plain or TLS.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub SocketAddr);
