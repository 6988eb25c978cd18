//! TLS on every link, against real servers with TLS on (private ones,
//! started by `scripts/services.sh` with certificates this test makes):
//! PostgreSQL that refuses plain connections (`hostnossl … reject`) and,
//! where asked, wants a client certificate; MariaDB with
//! `require_secure_transport = ON`; PgBouncer with `client_tls_sslmode =
//! require`; RabbitMQ with a TLS listener (`verify_peer`, and
//! `fail_if_no_peer_cert` with the EXTERNAL mechanism for mutual TLS), and
//! a TLS stream listener.
//!
//! Relays are judged by the consumer-side checker; every failure a user
//! can meet is asserted as the one line outboxd prints for it.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::tls::{Pki, ServerCert, TlsServer};
use common::*;
use outboxd::config::Config;
use outboxd::demo::QueueReader;
use outboxd::store::Store;

/// Runs `outboxd streams declare` against `stream_url` with `tls_toml`:
/// whether it succeeded, and what it said last (its answer, or its error).
fn declare_stream(env: &TestEnv, stream_url: &str, stream: &str, tls_toml: &str) -> (bool, String) {
    let config = env.dir.join(format!("{}.toml", unique("streams")));
    std::fs::write(&config, tls_toml).unwrap();
    let out = std::process::Command::new(BIN)
        .args([
            "streams",
            "declare",
            "--config",
            &config.display().to_string(),
        ])
        .env("OUTBOXD_AMQP__STREAM_URL", stream_url)
        .env("OUTBOXD_AMQP__STREAMS", stream)
        .env_remove("AMQP_URL")
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let last = said.trim().lines().last().unwrap_or_default().to_string();
    (out.status.success(), last)
}

/// `url` with `params` appended to its query.
fn with_query(url: &str, params: &[(&str, &Path)]) -> String {
    let mut url = url::Url::parse(url).unwrap();
    for (k, v) in params {
        url.query_pairs_mut()
            .append_pair(k, &v.display().to_string());
    }
    url.to_string()
}

fn pg_tls_url(base: &str, mode: &str, pki: &Pki, client: Option<&(PathBuf, PathBuf)>) -> String {
    let mut url = format!("{base}?sslmode={mode}");
    url = with_query(&url, &[("sslrootcert", &pki.ca)]);
    if let Some((cert, key)) = client {
        url = with_query(&url, &[("sslcert", cert), ("sslkey", key)]);
    }
    url
}

/// A private RabbitMQ with a TLS listener beside its plain one: the
/// broker, the listener's port, and the folder its certificate files come
/// from (`services.sh rabbit tls-reload` reads them again).
fn tls_broker(pki: &Pki, client_cert_required: bool) -> (PrivateBroker, u16, PathBuf) {
    let amqps_port = free_port_pair(|| 30000 + 2 * (rand_u16() % 1000));
    let mut server = TlsServer::new(pki, client_cert_required);
    server.amqps_port = Some(amqps_port);
    (
        PrivateBroker::start_with(server.env()),
        amqps_port,
        server.files,
    )
}

fn amqp_tls_toml(ca: &Path, client: Option<&(PathBuf, PathBuf)>) -> String {
    let mut toml = format!("[amqp.tls]\nca_file = \"{}\"\n", ca.display());
    if let Some((cert, key)) = client {
        toml += &format!(
            "cert_file = \"{}\"\nkey_file = \"{}\"\n",
            cert.display(),
            key.display()
        );
    }
    toml
}

/// Produces `n` messages over 200 keys while `workers` fleet workers drain,
/// and judges what `reader` received.
async fn relay_with_fleet(
    env: &TestEnv,
    reader: &mut QueueReader,
    queue: &str,
    n: usize,
    workers: usize,
) {
    let mut fleet: Vec<WorkerProcess> = (0..workers)
        .map(|_| env.spawn_worker(&["--silent"]))
        .collect();
    produce_evenly(
        env.db.clone(),
        queue.to_string(),
        n,
        200,
        Duration::from_secs(5),
    )
    .await;
    let (all, v) = read_and_judge(reader, env, n, Duration::from_secs(90)).await;
    let logs: Vec<String> = fleet.iter().map(|w| w.log_text()).collect();
    println!("{} workers over TLS: {}", workers, v.summary());
    assert!(all && v.is_clean(), "{v:?}\n{}", logs.join("\n---\n"));
    terminate_all(&mut fleet);
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_with_client_certificates_and_amqps_relay_5000_messages_with_a_fleet() {
    let pki = Pki::new();
    let pg = PrivatePostgres::start_with(TlsServer::new(&pki, true).env());
    let (broker, amqps_port, _) = tls_broker(&pki, false);
    let client = pki.client("outboxd", 1);
    let admin = pg_tls_url(&pg.admin_url(), "verify-full", &pki, Some(&client));
    let env = TestEnv::with(Tuning {
        server_admin_url: Some(admin),
        amqp_url: Some(format!("amqps://guest:guest@127.0.0.1:{amqps_port}/%2f")),
        extra_toml: amqp_tls_toml(&pki.ca, None),
        ..Tuning::fleet()
    })
    .await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&broker.url(), &queue).await.unwrap();
    relay_with_fleet(&env, &mut reader, &queue, 5_000, 2).await;

    // Every connection of the relay was TLS (the server refuses others),
    // with the client certificate.
    let plain: i64 = env
        .db
        .value("SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.datname = current_database() AND NOT s.ssl")
        .await;
    assert_eq!(plain, 0);
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_requiring_secure_transport_relays_5000_messages_with_a_fleet() {
    let pki = Pki::new();
    let my = PrivateMariaDb::start_with(TlsServer::new(&pki, false).env());
    let admin = with_query(
        &format!("{}?ssl-mode=VERIFY_IDENTITY", my.admin_url()),
        &[("ssl-ca", &pki.ca)],
    );
    let env = TestEnv::with(Tuning {
        server_admin_url: Some(admin),
        ..Tuning::fleet().on(Db::MariaDb)
    })
    .await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    relay_with_fleet(&env, &mut reader, &queue, 5_000, 2).await;
    let cipher: Vec<(String, String)> = env.db.rows("SHOW SESSION STATUS LIKE 'Ssl_cipher'").await;
    assert!(
        !cipher[0].1.is_empty(),
        "the test's own connection is TLS too"
    );
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_terminating_tls_relays_5000_messages() {
    let pki = Pki::new();
    let server = TlsServer::new(&pki, false);
    let dir = std::path::PathBuf::from(
        std::env::var("OUTBOXD_STATE_DIR").unwrap_or_else(|_| "/tmp".into()),
    )
    .join(unique("pgbouncer-tls"));
    let port = free_port_pair(|| 31000 + 2 * (rand_u16() % 1000));
    let pg_port = std::env::var("OUTBOXD_PG_PORT").unwrap_or_else(|_| "55432".into());
    let run = |action: &str| {
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(repo_dir().join("scripts/services.sh"))
            .args(["pgbouncer", action])
            .arg(&dir);
        if action == "start" {
            cmd.args([port.to_string(), "127.0.0.1".into(), pg_port.clone()]);
        }
        assert!(cmd.envs(server.env()).status().unwrap().success());
    };
    run("start");
    let bouncer = pg_tls_url(
        &format!("postgres://outboxd:outboxd@127.0.0.1:{port}/"),
        "verify-full",
        &pki,
        None,
    );
    let env = TestEnv::with(Tuning {
        pooler_url: Some(bouncer.clone()),
        ..Tuning::default()
    })
    .await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    relay_with_fleet(&env, &mut reader, &queue, 5_000, 1).await;

    // PgBouncer refuses a plain client.
    let mut plain = env.config.clone();
    plain.database.url = with_database(
        &format!("postgres://outboxd:outboxd@127.0.0.1:{port}/?sslmode=disable"),
        &env.db_name,
    );
    let e = Store::connect(
        &outboxd::store::StoreSettings::from_config(&plain),
        "tls test",
    )
    .await
    .err()
    .unwrap_or_else(|| panic!("refused"))
    .to_string();
    println!("plain client against PgBouncer: {e}");
    assert!(!e.contains('\n'), "{e}");
    run("stop");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Connects a store with `url` and returns the one line it fails with.
async fn db_refusal(config: &Config, url: &str) -> String {
    let mut c = config.clone();
    c.database.url = url.to_string();
    let e = Store::connect(&outboxd::store::StoreSettings::from_config(&c), "tls test")
        .await
        .err();
    one_line(e.map(|e| e.to_string()))
}

/// The error a connection that must fail failed with: one line, printed.
fn one_line(error: Option<String>) -> String {
    let e = error.unwrap_or_else(|| panic!("the connection must fail"));
    assert!(!e.contains('\n'), "one line: {e}");
    println!("{e}");
    e
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tls_failures_are_one_line_naming_the_host_and_the_fix() {
    let pki = Pki::new();
    let server = TlsServer::new(&pki, false);
    let pg = PrivatePostgres::start_with(server.env());
    let base = pg.admin_url();
    let config = Config::default();

    // A plain URL against a server that accepts TLS only.
    let e = db_refusal(&config, &format!("{base}?sslmode=disable")).await;
    assert!(
        e.contains("accepts only TLS connections") && e.contains("sslmode=verify-full"),
        "{e}"
    );

    // verify-full against another CA.
    let other = Pki::new();
    let e = db_refusal(&config, &pg_tls_url(&base, "verify-full", &other, None)).await;
    assert!(
        e.contains("not trusted") && e.contains(&other.ca.display().to_string()),
        "{e}"
    );
    // require with a root certificate named verifies the chain (libpq's rule).
    let e = db_refusal(&config, &pg_tls_url(&base, "require", &other, None)).await;
    assert!(e.contains("not trusted"), "{e}");

    // A certificate for another name.
    pki.server_files(&server.files, ServerCert::For(&["db.example"]));
    pg.run(&["tls-reload"]);
    let e = db_refusal(&config, &pg_tls_url(&base, "verify-full", &pki, None)).await;
    assert!(
        e.contains("'127.0.0.1'") && e.contains("db.example") && e.contains("verify-ca"),
        "{e}"
    );
    // verify-ca does not check the name.
    let mut c = config.clone();
    c.database.url = pg_tls_url(&base, "verify-ca", &pki, None);
    Store::connect(&outboxd::store::StoreSettings::from_config(&c), "tls test")
        .await
        .expect("verify-ca skips the name");

    // An expired certificate.
    pki.server_files(&server.files, ServerCert::Expired);
    pg.run(&["tls-reload"]);
    let e = db_refusal(&config, &pg_tls_url(&base, "verify-full", &pki, None)).await;
    assert!(e.contains("expired on 2021-01-02"), "{e}");

    // require against a server without TLS (the shared one).
    let e = db_refusal(&config, &format!("{}?sslmode=require", admin_url())).await;
    assert!(e.contains("does not offer TLS"), "{e}");

    // The command line says it in one line too, exit code 1.
    let out = std::process::Command::new(BIN)
        .args(["migrate", "--database-url"])
        .arg(pg_tls_url(&base, "verify-full", &other, None))
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("expired on 2021-01-02"), "{stderr}");
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_a_missing_or_foreign_client_certificate_in_one_line() {
    let pki = Pki::new();
    let pg = PrivatePostgres::start_with(TlsServer::new(&pki, true).env());
    let base = pg.admin_url();
    let config = Config::default();
    let e = db_refusal(&config, &pg_tls_url(&base, "verify-full", &pki, None)).await;
    assert!(e.contains("client certificate"), "{e}");
    let other = Pki::new();
    let foreign = other.client("outboxd", 1);
    let e = db_refusal(
        &config,
        &pg_tls_url(&base, "verify-full", &pki, Some(&foreign)),
    )
    .await;
    assert!(e.contains("client certificate"), "{e}");
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_tls_failures_are_one_line() {
    let pki = Pki::new();
    let my = PrivateMariaDb::start_with(TlsServer::new(&pki, false).env());
    let config = Config::default();
    let base = my.admin_url();
    let e = db_refusal(&config, &format!("{base}?ssl-mode=DISABLED")).await;
    assert!(
        e.contains("refused a connection without TLS") && e.contains("ssl-mode=VERIFY_IDENTITY"),
        "{e}"
    );
    let other = Pki::new();
    let url = with_query(
        &format!("{base}?ssl-mode=VERIFY_IDENTITY"),
        &[("ssl-ca", &other.ca)],
    );
    let e = db_refusal(&config, &url).await;
    assert!(
        e.contains("not trusted") && e.contains(&other.ca.display().to_string()),
        "{e}"
    );
    let e = db_refusal(&config, &format!("{}?ssl-mode=REQUIRED", mysql_admin_url())).await;
    assert!(e.contains("does not offer TLS"), "{e}");
}

/// Connects to `url` with `[amqp.tls]` from `tls_toml` and returns the one
/// line it fails with.
async fn broker_refusal(url: &str, tls_toml: &str) -> String {
    let config = Config::from_toml(&format!("[amqp]\nurl = \"{url}\"\n{tls_toml}")).unwrap();
    config.validate().unwrap();
    let broker = outboxd::amqp::Broker::new(&config.amqp, "tls test".into());
    one_line(broker.connect_once().await.err().map(|e| e.to_string()))
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_failures_are_one_line_and_never_fall_back_to_plain() {
    let pki = Pki::new();
    let (broker, amqps_port, server_files) = tls_broker(&pki, true);
    let url = format!("amqps://guest:guest@127.0.0.1:{amqps_port}/%2f");
    let client = pki.client("outboxd", 1);

    // No client certificate, where the server requires one.
    let e = broker_refusal(&url, &amqp_tls_toml(&pki.ca, None)).await;
    assert!(
        e.contains("requires a client certificate")
            || e.contains("if it requires a client certificate"),
        "{e}"
    );
    // One from another CA.
    let other = Pki::new();
    let foreign = other.client("outboxd", 1);
    let e = broker_refusal(&url, &amqp_tls_toml(&pki.ca, Some(&foreign))).await;
    assert!(e.contains("refused the client certificate"), "{e}");
    // The server's certificate checked against another CA, and against the
    // system's roots.
    let e = broker_refusal(&url, &amqp_tls_toml(&other.ca, Some(&client))).await;
    assert!(
        e.contains("not trusted") && e.contains(&other.ca.display().to_string()),
        "{e}"
    );
    let e = broker_refusal(&url, "").await;
    assert!(
        e.contains("not trusted") && e.contains("system's trusted roots"),
        "{e}"
    );
    // A plain URL against the TLS port.
    let e = broker_refusal(
        &format!("amqp://guest:guest@127.0.0.1:{amqps_port}/%2f"),
        "",
    )
    .await;
    assert!(e.contains("amqps://"), "{e}");
    // An amqps URL against the plain port: never plain.
    let e = broker_refusal(
        &format!("amqps://guest:guest@127.0.0.1:{}/%2f", broker.port),
        &amqp_tls_toml(&pki.ca, Some(&client)),
    )
    .await;
    assert!(e.contains("TLS"), "{e}");
    // Another name, then an expired certificate.
    pki.server_files(&server_files, ServerCert::For(&["broker.example"]));
    broker.run("tls-reload");
    let e = broker_refusal(&url, &amqp_tls_toml(&pki.ca, Some(&client))).await;
    assert!(
        e.contains("'127.0.0.1'") && e.contains("broker.example"),
        "{e}"
    );
    pki.server_files(&server_files, ServerCert::Expired);
    broker.run("tls-reload");
    let e = broker_refusal(&url, &amqp_tls_toml(&pki.ca, Some(&client))).await;
    assert!(e.contains("expired on 2021-01-02"), "{e}");
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_external_login_survives_rotated_certificates() {
    let pki = Pki::new();
    let pg_server = TlsServer::new(&pki, true);
    let pg = PrivatePostgres::start_with(pg_server.env());
    let (broker, amqps_port, broker_files) = tls_broker(&pki, true);
    // EXTERNAL: the client certificate's common name is the user.
    broker.ctl(&["add_user", "outboxd-relay", "unused-password"]);
    broker.ctl(&["set_permissions", "outboxd-relay", ".*", ".*", ".*"]);
    let (cert, key) = pki.client("outboxd-relay", 1);
    let admin = pg_tls_url(
        &pg.admin_url(),
        "verify-full",
        &pki,
        Some(&(cert.clone(), key.clone())),
    );
    let env = TestEnv::with(Tuning {
        server_admin_url: Some(admin),
        // No password: the EXTERNAL mechanism.
        amqp_url: Some(format!("amqps://outboxd-relay@127.0.0.1:{amqps_port}/%2f")),
        extra_toml: amqp_tls_toml(&pki.ca, Some(&(cert.clone(), key.clone()))),
        ..Tuning::default()
    })
    .await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&broker.url(), &queue).await.unwrap();
    let mut worker = env.spawn_worker(&["--silent"]);
    produce_evenly(
        env.db.clone(),
        queue.clone(),
        2_500,
        50,
        Duration::from_secs(3),
    )
    .await;
    let got = reader
        .read_until(Duration::from_secs(60), |c| c.unique() >= 2_500)
        .await
        .unwrap();
    assert!(got, "{}", worker.log_text());
    let users = broker_connections(&broker);
    assert!(
        users.contains("outboxd-relay"),
        "logged in by its certificate: {users}"
    );

    // Rotation: new server certificates on both servers, a new client
    // certificate (serial 2, valid from 2002) in the same files; then both
    // links are cut from the servers' side.
    pki.server_files(&pg_server.files, ServerCert::Good);
    pg.run(&["tls-reload"]);
    pki.server_files(&broker_files, ServerCert::Good);
    broker.run("tls-reload");
    let (new_cert, new_key) = pki.client("outboxd-relay", 2);
    std::fs::copy(&new_cert, &cert).unwrap();
    std::fs::copy(&new_key, &key).unwrap();
    let cut: i64 = env
        .db
        .value(&format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '{}' AND pid <> pg_backend_pid() AND application_name LIKE 'outboxd%'",
            env.db_name
        ))
        .await;
    let closed = close_connections_of(&broker, "outboxd-relay");
    println!("cut {cut} database connections and {closed} broker connections");
    assert!(cut > 0 && closed > 0);

    produce_evenly(
        env.db.clone(),
        queue.clone(),
        2_500,
        50,
        Duration::from_secs(3),
    )
    .await;
    let (all, v) = read_and_judge(&mut reader, &env, 5_000, Duration::from_secs(60)).await;
    println!("mutual TLS with rotation: {}", v.summary());
    assert!(
        all && v.is_clean(),
        "{v:?}
{}",
        worker.log_text()
    );

    // The worker's new connections present the new client certificate.
    let serials: Vec<String> = env
        .db
        .column(&format!(
            "SELECT s.client_serial::text FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.datname = '{}' AND a.application_name LIKE 'outboxd%'",
            env.db_name
        ))
        .await;
    assert!(
        !serials.is_empty() && serials.iter().all(|s| s == "2"),
        "{serials:?}"
    );
    let validity = broker_connections(&broker);
    assert!(
        validity.contains("2002-01-01"),
        "the broker sees the new certificate: {validity}"
    );
    assert!(worker.terminate(EXIT_WITHIN).success());
}

/// Closes every connection of `user` from the broker's side; how many.
fn close_connections_of(broker: &PrivateBroker, user: &str) -> usize {
    let out = std::process::Command::new("bash")
        .arg(repo_dir().join("scripts/services.sh"))
        .args(["rabbit", "ctl"])
        .arg(&broker.dir)
        .arg(broker.port.to_string())
        .args(["-q", "list_connections", "pid", "user"])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let pids: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .filter(|(_, u)| u.trim() == user)
        .map(|(pid, _)| pid.trim())
        .collect();
    for pid in &pids {
        broker.ctl(&["close_connection", pid, "certificate rotation test"]);
    }
    pids.len()
}

/// `rabbitmqctl list_connections user peer_cert_validity` of `broker`.
fn broker_connections(broker: &PrivateBroker) -> String {
    let out = std::process::Command::new("bash")
        .arg(repo_dir().join("scripts/services.sh"))
        .args(["rabbit", "ctl"])
        .arg(&broker.dir)
        .arg(broker.port.to_string())
        .args(["-q", "list_connections", "user", "peer_cert_validity"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_reach_a_stream_over_tls_once_and_never_in_plain_text() {
    let pki = Pki::new();
    let mut server = TlsServer::new(&pki, false);
    server.amqps_port = Some(free_port_pair(|| 30000 + 2 * (rand_u16() % 1000)));
    let plain_port = free_port_pair(|| 20000 + 2 * (rand_u16() % 2000));
    let tls_port = free_port_pair(|| 20000 + 2 * (rand_u16() % 2000));
    let mut vars = server.env();
    vars.push(("OUTBOXD_STREAM_PORT".into(), plain_port.to_string()));
    vars.push(("OUTBOXD_STREAM_TLS_PORT".into(), tls_port.to_string()));
    let broker = PrivateBroker::start_with(vars);
    let env = TestEnv::with(Tuning {
        amqp_url: Some(broker.url()),
        ..Tuning::fleet()
    })
    .await;
    let tls_url = format!("rabbitmq-stream+tls://guest:guest@127.0.0.1:{tls_port}/%2f");
    let trusted = amqp_tls_toml(&pki.ca, None);
    let stream = unique("s");

    // Never plain: a TLS URL at the plain stream port, the broker's
    // certificate checked against another CA, then against the system's
    // roots — each ends in one line saying why, and nothing is created.
    let plain_at_tls = format!("rabbitmq-stream+tls://guest:guest@127.0.0.1:{plain_port}/%2f");
    let (ok, said) = declare_stream(&env, &plain_at_tls, &stream, &trusted);
    println!("a TLS URL at the plain port: {said}");
    assert!(!ok && said.contains("TLS"), "{said}");
    let other = Pki::new();
    let (ok, said) = declare_stream(&env, &tls_url, &stream, &amqp_tls_toml(&other.ca, None));
    println!("another CA: {said}");
    assert!(
        !ok && said.lines().count() == 1
            && said.contains("not trusted")
            && said.contains(&other.ca.display().to_string()),
        "{said}"
    );
    let (ok, said) = declare_stream(&env, &tls_url, &stream, "");
    println!("the system's roots: {said}");
    assert!(!ok && said.contains("system's trusted roots"), "{said}");

    // Over TLS: the stream is declared, and a fleet relays into it.
    let (ok, said) = declare_stream(&env, &tls_url, &stream, &trusted);
    assert!(ok && said == format!("{stream}: created"), "{said}");
    std::fs::write(
        &env.config_path,
        format!(
            "{}\n{trusted}",
            std::fs::read_to_string(&env.config_path).unwrap()
        ),
    )
    .unwrap();
    let stream_vars = [
        ("OUTBOXD_AMQP__STREAM_URL", tls_url.as_str()),
        ("OUTBOXD_AMQP__STREAMS", stream.as_str()),
    ];
    let mut fleet: Vec<WorkerProcess> = (0..2)
        .map(|_| env.spawn_worker_with(None, &env.config_path, &["--silent"], &stream_vars))
        .collect();
    produce_evenly(
        env.db.clone(),
        stream.clone(),
        2_000,
        200,
        Duration::from_secs(4),
    )
    .await;
    env.wait_count("published_at IS NOT NULL", 2_000, Duration::from_secs(60))
        .await;
    let v = common::streams::judge_stream(&env, &broker.stream_url(), &stream).await;
    let logs: Vec<String> = fleet.iter().map(|w| w.log_text()).collect();
    println!("2 workers into a stream over TLS: {}", v.summary());
    assert!(
        v.is_clean() && v.unique == 2_000,
        "{v:?}\n{}",
        logs.join("\n---\n")
    );
    terminate_all(&mut fleet);
}
