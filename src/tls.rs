//! TLS on every outgoing link: one stack (rustls, with the *ring* crypto
//! provider), one vocabulary of failures.
//!
//! - **PostgreSQL and MySQL/MariaDB**: sqlx's own rustls support, driven by
//!   the URL parameters users already write (`sslmode`, `sslrootcert`,
//!   `sslcert`, `sslkey`; `ssl-mode`, `ssl-ca`, `ssl-cert`, `ssl-key`).
//!   sqlx reads those files at every new connection.
//! - **RabbitMQ**: `amqps://` nodes. lapin is built without TLS; outboxd
//!   wraps the broker socket itself ([`crate::amqp::gate`]), below lapin and
//!   above the send gate, with a [`rustls::ClientConfig`] built by
//!   [`AmqpTls::client_config`] from `amqp.tls.*` — again at every new
//!   connection, so rotated files are used from the next reconnect.
//!
//! Server certificates are verified against the named CA file, or the
//! system's trusted roots (Debian's `ca-certificates`) when none is named;
//! an `amqps://` URL never falls back to plain TCP.
//!
//! [`explain`] turns a failed handshake (found anywhere in an error's
//! chain) into one line naming the server and what to change: a
//! certificate not trusted (which CA was used), a name mismatch (asked vs
//! presented), an expired certificate (its expiry date), a server that
//! offers no TLS, a server that accepts only TLS, a refused client
//! certificate.

use std::error::Error as StdError;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{AlertDescription, CertificateError, ClientConfig, RootCertStore};

/// Which link a connection is, for the names of the settings in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Postgres,
    MySql,
    Amqp,
}

impl Link {
    fn name(self) -> &'static str {
        match self {
            Link::Postgres => "PostgreSQL",
            Link::MySql => "MySQL/MariaDB",
            Link::Amqp => "RabbitMQ",
        }
    }

    /// The settings naming the CA file, the client certificate and its key.
    fn keys(self) -> [&'static str; 3] {
        match self {
            Link::Postgres => ["sslrootcert", "sslcert", "sslkey"],
            Link::MySql => ["ssl-ca", "ssl-cert", "ssl-key"],
            Link::Amqp => [
                "amqp.tls.ca_file",
                "amqp.tls.cert_file",
                "amqp.tls.key_file",
            ],
        }
    }

    /// What to write in the URL to ask for verified TLS.
    fn ask_for_tls(self) -> &'static str {
        match self {
            Link::Postgres => "add sslmode=verify-full (and sslrootcert=<CA file>) to the URL",
            Link::MySql => "add ssl-mode=VERIFY_IDENTITY (and ssl-ca=<CA file>) to the URL",
            Link::Amqp => "use an amqps:// URL (port 5671 by default)",
        }
    }
}

/// The files of one TLS link, as configured (empty: not set).
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

impl TlsFiles {
    /// Reads the files now (a rotated file is used from the next
    /// connection) and builds a client configuration: the CA file's roots
    /// (else the system's), the client certificate when both it and its key
    /// are set. Errors are one line naming the setting (`keys`: the names of
    /// the CA, certificate and key settings) and the file.
    pub fn client_config(&self, keys: [&str; 3]) -> Result<Arc<ClientConfig>, String> {
        let [ca_key, cert_key, key_key] = keys;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots(self.ca_file.as_deref(), ca_key)?);
        let config = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => builder
                .with_client_auth_cert(certificates(cert, cert_key)?, private_key(key, key_key)?)
                .map_err(|e| {
                    format!(
                        "{cert_key} {} and {key_key} {} do not go together: {e}",
                        cert.display(),
                        key.display()
                    )
                })?,
            _ => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
    }

    /// Checks that the files a database URL names (`sslrootcert`/`ssl-ca`,
    /// …) can be read and parsed, before any connection tries them: the
    /// driver's own error for a missing file names neither the setting
    /// nor the path. `Err` is one line naming both.
    pub fn check_url(link: Link, url: &str) -> Result<(), String> {
        let mut files = Self::from_url(link, url);
        // libpq's `sslrootcert=system`: the system's roots, not a file.
        if files.ca_file.as_deref() == Some(Path::new("system")) {
            files.ca_file = None;
        }
        if files.ca_file.is_none() && files.cert_file.is_none() && files.key_file.is_none() {
            return Ok(());
        }
        files.client_config(link.keys()).map(|_| ())
    }

    /// The files named in a database URL's query (`sslrootcert`/`ssl-ca`, …).
    pub fn from_url(link: Link, url: &str) -> Self {
        let [ca, cert, key] = link.keys();
        let Ok(url) = url::Url::parse(url) else {
            return Self::default();
        };
        let get = |name: &str| {
            url.query_pairs()
                .find(|(k, _)| k == name || k.replace('-', "") == name.replace('-', ""))
                .map(|(_, v)| PathBuf::from(v.into_owned()))
        };
        Self {
            ca_file: get(ca),
            cert_file: get(cert),
            key_file: get(key),
        }
    }
}

/// The broker's TLS settings (`[amqp.tls]`), turned into a rustls client
/// configuration for every new connection.
#[derive(Debug, Clone, Default)]
pub struct AmqpTls {
    pub files: TlsFiles,
}

impl AmqpTls {
    /// Reads the files now (a rotated file is used from the next
    /// connection) and builds the client configuration. The error is one
    /// line naming the file.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, String> {
        self.files.client_config(Link::Amqp.keys())
    }

    /// Whether a client certificate is configured.
    pub fn has_client_cert(&self) -> bool {
        self.files.cert_file.is_some()
    }
}

/// The trusted roots: the CA file's certificates, or the system's.
fn roots(ca_file: Option<&Path>, key: &str) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for cert in certificates(path, key)? {
                store
                    .add(cert)
                    .map_err(|e| format!("{key} {}: {e}", path.display()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            store.add_parsable_certificates(found.certs);
            if store.is_empty() {
                return Err(format!(
                    "no trusted root certificates on this system (install ca-certificates) and no {key} set"
                ));
            }
        }
    }
    Ok(store)
}

fn certificates(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read(path, key)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{key} {}: not a PEM certificate file: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{key} {}: holds no PEM certificate",
            path.display()
        ));
    }
    Ok(certs)
}

fn private_key(path: &Path, key: &str) -> Result<PrivateKeyDer<'static>, String> {
    let pem = read(path, key)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| format!("{key} {}: no PEM private key: {e}", path.display()))
}

fn read(path: &Path, key: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{key} {}: cannot read: {e}", path.display()))
}

/// The name the server's certificate must carry: the URL's host.
pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .map_err(|e| format!("'{host}' is not a server name: {e}"))
}

/// Why a connection to `url` failed, as one line naming the server (by the
/// URL's host) and what to change, when the failure is about TLS; `None`
/// otherwise. Callers put it after the (redacted) URL.
///
/// `files` are the link's CA, certificate and key files
/// ([`TlsFiles::from_url`] for a database).
pub fn explain(
    link: Link,
    url: &str,
    files: &TlsFiles,
    error: &(dyn StdError + 'static),
) -> Option<String> {
    let host = url::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(String::from))
        .unwrap_or_else(|| "the server".into());
    let what = format!("{} server {host}", link.name());
    let [_, cert_key, key_key] = link.keys();
    if let Some(tls) = find_rustls(error) {
        return Some(explain_rustls(link, &what, tls, files));
    }
    let text = chain_text(error);
    let lower = text.to_lowercase();
    if lower.contains("server does not support tls") {
        return Some(format!(
            "{what} does not offer TLS, but the URL requires it: enable TLS on the server, or lower the URL's {} ({})",
            if link == Link::Postgres {
                "sslmode"
            } else {
                "ssl-mode"
            },
            text.trim()
        ));
    }
    // PostgreSQL: pg_hba.conf's `hostnossl … reject` (or no `host` line
    // for plain text). MariaDB answers a plain connection under
    // `require_secure_transport` with a bare "Access denied"; MySQL names it.
    let plain_refused = match link {
        Link::Postgres => lower.contains("no encryption"),
        Link::MySql => {
            lower.contains("insecure transport")
                || (lower.contains("access denied") && mysql_tls_disabled(url))
        }
        Link::Amqp => false,
    };
    if plain_refused && link == Link::MySql && lower.contains("access denied") {
        return Some(format!(
            "{what} refused a connection without TLS (ssl-mode=DISABLED): if the password is right, the server requires secure transport: {} ({})",
            link.ask_for_tls(),
            text.trim()
        ));
    }
    if plain_refused {
        return Some(format!(
            "{what} accepts only TLS connections here: {} ({})",
            link.ask_for_tls(),
            text.trim()
        ));
    }
    if lower.contains("client certificate")
        || (lower.contains("certificate")
            && (lower.contains("authentication failed") || lower.contains("x509")))
    {
        return Some(format!(
            "{what} refused the client certificate {}: check {cert_key}/{key_key} (the server wants one it trusts, for this user) ({})",
            files
                .cert_file
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "(none given)".into()),
            text.trim()
        ));
    }
    None
}

/// Whether a MySQL URL turns TLS off.
fn mysql_tls_disabled(url: &str) -> bool {
    url::Url::parse(url).is_ok_and(|u| {
        u.query_pairs().any(|(k, v)| {
            matches!(&*k, "ssl-mode" | "sslmode") && v.eq_ignore_ascii_case("disabled")
        })
    })
}

fn explain_rustls(link: Link, what: &str, error: &rustls::Error, files: &TlsFiles) -> String {
    let [ca_key, cert_key, key_key] = link.keys();
    let trusted_by = match &files.ca_file {
        Some(ca) => format!("the CA file {} ({ca_key})", ca.display()),
        None => format!("the system's trusted roots (no {ca_key} set)"),
    };
    match error {
        rustls::Error::InvalidCertificate(cert) => match cert {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => format!(
                "{what}: the server's certificate is not trusted: it is not signed by a CA in {trusted_by}; set {ca_key} to the CA file that signed it"
            ),
            CertificateError::NotValidForNameContext {
                expected,
                presented,
            } => format!(
                "{what}: the server's certificate is not valid for the name '{}' the URL asks for; it names {}: connect by one of those names{}",
                expected.to_str(),
                if presented.is_empty() {
                    "no names at all".to_string()
                } else {
                    presented.join(", ")
                },
                match link {
                    Link::Postgres => ", or use sslmode=verify-ca to skip the name check",
                    Link::MySql => ", or use ssl-mode=VERIFY_CA to skip the name check",
                    Link::Amqp => ", or have the certificate reissued for it",
                }
            ),
            CertificateError::NotValidForName => format!(
                "{what}: the server's certificate is not valid for the name the URL asks for: connect by a name the certificate carries"
            ),
            CertificateError::ExpiredContext { not_after, .. } => format!(
                "{what}: the server's certificate expired on {}: renew it on the server",
                unix_date(not_after.as_secs())
            ),
            CertificateError::Expired => {
                format!("{what}: the server's certificate has expired: renew it on the server")
            }
            CertificateError::NotValidYetContext { not_before, .. } => format!(
                "{what}: the server's certificate is not valid before {}: check the clocks, or the certificate",
                unix_date(not_before.as_secs())
            ),
            other => format!(
                "{what}: the server's certificate was refused ({other}); it was checked against {trusted_by}"
            ),
        },
        rustls::Error::AlertReceived(alert) => {
            let client_cert_problem = matches!(
                alert,
                AlertDescription::CertificateRequired
                    | AlertDescription::BadCertificate
                    | AlertDescription::UnknownCA
                    | AlertDescription::CertificateUnknown
                    | AlertDescription::CertificateExpired
                    | AlertDescription::CertificateRevoked
                    | AlertDescription::UnsupportedCertificate
                    | AlertDescription::AccessDenied
                    | AlertDescription::HandshakeFailure
            );
            match (&files.cert_file, client_cert_problem) {
                (None, true) => format!(
                    "{what} requires a client certificate (TLS alert {alert:?}): set {cert_key} and {key_key}"
                ),
                (Some(cert), true) => format!(
                    "{what} refused the client certificate {} ({cert_key}) with TLS alert {alert:?}: use one signed by a CA the server trusts",
                    cert.display()
                ),
                (_, false) => format!("{what} ended the TLS handshake with alert {alert:?}"),
            }
        }
        rustls::Error::InvalidMessage(_) => format!(
            "{what} did not answer in TLS: is this port a plain one? ({}; TLS handshake: {error})",
            match link {
                Link::Amqp => "amqps:// listens on 5671 by default, amqp:// on 5672",
                _ => "check the URL's port",
            }
        ),
        other => format!("{what}: TLS handshake failed: {other}"),
    }
}

/// A UNIX time as a UTC date and time.
fn unix_date(secs: u64) -> String {
    chrono::DateTime::from_timestamp(secs as i64, 0)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| format!("{secs} (UNIX time)"))
}

/// The rustls error somewhere in `error`'s chain, including inside
/// `io::Error`s (whose payload `source()` does not return).
pub fn find_rustls<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut next: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(inner) = e.downcast_ref::<io::Error>().and_then(|io| io.get_ref())
            && let Some(tls) = find_rustls(inner)
        {
            return Some(tls);
        }
        next = e.source();
    }
    None
}

/// The error and its causes, each once; a database's own error as its
/// message alone (without sqlx's prefix and the server's source line).
fn chain_text(error: &(dyn StdError + 'static)) -> String {
    if let Some(sqlx::Error::Database(db)) = error.downcast_ref::<sqlx::Error>() {
        return db.message().to_string();
    }
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(e) = next {
        let s = e.to_string();
        if !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
        next = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_read_from_either_spelling_of_the_url_parameters() {
        let f = TlsFiles::from_url(
            Link::MySql,
            "mysql://u@h/db?ssl-mode=VERIFY_CA&sslca=/ca.pem&ssl-cert=/c.pem&ssl-key=/k.pem",
        );
        assert_eq!(f.ca_file.as_deref(), Some(Path::new("/ca.pem")));
        assert_eq!(f.cert_file.as_deref(), Some(Path::new("/c.pem")));
        assert_eq!(f.key_file.as_deref(), Some(Path::new("/k.pem")));
    }

    #[test]
    fn an_unreadable_file_is_one_line_naming_it() {
        let tls = AmqpTls {
            files: TlsFiles {
                ca_file: Some("/nonexistent/ca.pem".into()),
                ..Default::default()
            },
        };
        let e = tls.client_config().unwrap_err();
        assert!(
            e.starts_with("amqp.tls.ca_file /nonexistent/ca.pem: cannot read"),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }

    #[test]
    fn a_name_mismatch_names_both_sides() {
        let error = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                expected: ServerName::try_from("db.example").unwrap(),
                presented: vec!["DnsName(\"other.example\")".into()],
            }),
        );
        let url = "postgres://u@db.example:5432/x?sslmode=verify-full";
        let line = explain(
            Link::Postgres,
            url,
            &TlsFiles::from_url(Link::Postgres, url),
            &error,
        )
        .unwrap();
        assert!(
            line.contains("'db.example'") && line.contains("other.example"),
            "{line}"
        );
        assert!(line.starts_with("PostgreSQL server db.example:"), "{line}");
    }
}
