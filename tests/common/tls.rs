//! A private certificate authority for the TLS tests: a CA, server
//! certificates (for `127.0.0.1` and `localhost`, or for other names, or
//! expired), client certificates, all generated here with `rcgen` and
//! written as PEM files — never committed.
//!
//! [`TlsServer`] is the environment `scripts/services.sh` reads to start a
//! private PostgreSQL, MariaDB, PgBouncer or RabbitMQ with TLS on.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, date_time_ymd,
};

/// A unique name with `prefix` (this module is shared with the bench,
/// which has no `common`).
fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A CA and the folder its files are written to.
pub struct Pki {
    pub dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    /// The CA's certificate (PEM).
    pub ca: PathBuf,
}

/// What a server certificate should look like.
pub enum ServerCert<'a> {
    /// Valid now, for `127.0.0.1` and `localhost`.
    Good,
    /// Valid now, for these names only.
    For(&'a [&'a str]),
    /// For `127.0.0.1` and `localhost`, but expired on 2021-01-02.
    Expired,
}

impl Pki {
    /// A new CA in a new temporary folder.
    pub fn new() -> Self {
        Self::in_dir(&std::env::temp_dir())
    }

    /// A new CA in a new folder under `parent`.
    pub fn in_dir(parent: &Path) -> Self {
        let dir = parent.join(unique("outboxd-pki"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, unique("outboxd test CA"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, cert.pem()).unwrap();
        Self {
            dir,
            issuer: Issuer::new(params, key),
            ca,
        }
    }

    /// Writes `ca.pem`, `server.pem` and `server.key` into `into` (the
    /// folder `services.sh` reads; created if missing).
    pub fn server_files(&self, into: &Path, what: ServerCert) {
        std::fs::create_dir_all(into).unwrap();
        let names: Vec<String> = match what {
            ServerCert::For(names) => names.iter().map(|n| n.to_string()).collect(),
            _ => vec!["127.0.0.1".into(), "localhost".into()],
        };
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "outboxd test server");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        if let ServerCert::Expired = what {
            params.not_before = date_time_ymd(2020, 1, 1);
            params.not_after = date_time_ymd(2021, 1, 2);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        std::fs::copy(&self.ca, into.join("ca.pem")).unwrap();
        std::fs::write(into.join("server.pem"), cert.pem()).unwrap();
        std::fs::write(into.join("server.key"), key.serialize_pem()).unwrap();
    }

    /// A client certificate with common name `cn`, serial number
    /// `generation` and valid from January 1st of the year 2000 +
    /// `generation` (how a test tells rotated certificates apart): its
    /// certificate and key files, in this CA's folder.
    pub fn client(&self, cn: &str, generation: u8) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.serial_number = Some(rcgen::SerialNumber::from(vec![generation]));
        params.not_before = date_time_ymd(2000 + i32::from(generation), 1, 1);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let stem = unique("client");
        let (cert_file, key_file) = (
            self.dir.join(format!("{stem}.pem")),
            self.dir.join(format!("{stem}.key")),
        );
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        (cert_file, key_file)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The files and settings a TLS server is started with.
pub struct TlsServer {
    /// The folder with `ca.pem`, `server.pem`, `server.key`.
    pub files: PathBuf,
    /// Whether clients must present a certificate.
    pub client_cert_required: bool,
    /// RabbitMQ only: the TLS listener's port.
    pub amqps_port: Option<u16>,
    /// PostgreSQL only: plain connections are served too (the bench
    /// compares both on one server).
    pub plain_too: bool,
}

impl TlsServer {
    /// A server certificate from `pki` in a new folder under its own.
    pub fn new(pki: &Pki, client_cert_required: bool) -> Self {
        let files = pki.dir.join(unique("server"));
        pki.server_files(&files, ServerCert::Good);
        Self {
            files,
            client_cert_required,
            amqps_port: None,
            plain_too: false,
        }
    }

    /// The environment `services.sh` reads.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![(
            "OUTBOXD_TLS_DIR".to_string(),
            self.files.display().to_string(),
        )];
        if self.client_cert_required {
            env.push(("OUTBOXD_TLS_CLIENT".into(), "required".into()));
        }
        if self.plain_too {
            env.push(("OUTBOXD_TLS_PLAIN_TOO".into(), "1".into()));
        }
        if let Some(port) = self.amqps_port {
            env.push(("OUTBOXD_AMQPS_PORT".into(), port.to_string()));
        }
        env
    }
}
