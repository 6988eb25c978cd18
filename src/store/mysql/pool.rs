//! MySQL/MariaDB: the connection pool.
//!
//! Every connection runs the relay's statements at READ COMMITTED (a plain
//! read takes no locks and no statement takes gap locks, so producers'
//! inserts never wait for a claim), gives up a lock wait within
//! `database.query_timeout` on the server side too, and is hardened
//! against a silent peer ([`crate::net`]). Time zone `+00:00` (sqlx's
//! default), though every statement uses `UTC_TIMESTAMP(6)` anyway. After a
//! switchover the pool closes connections opened before the database was
//! seen read-only ([`crate::store::switchover`]).
//!
//! Statements take their connections from a [`PacedPool`]: they share the
//! connections it has while it grows in the background, paced, and back
//! off when the server refuses another (`Too many connections`, or a
//! user's `MAX_USER_CONNECTIONS`), instead of each statement that found
//! none idle opening one — and failing at once when refused (sqlx does not
//! retry a refusal on MySQL): 578 statements failed in the capped test of
//! `tests/relay.rs` before, none after.

use sqlx::MySql;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPoolOptions};

use crate::stamp::Stamp;
use crate::store::bounds::Bounds;
use crate::store::error::StoreError;
use crate::store::paced::{self, PacedPool};
use crate::store::settings::StoreSettings;
use crate::store::settings::{BackendKind, shown};

/// The store's pool on MySQL/MariaDB: a sqlx executor like `&MySqlPool`
/// whose statements take their connections from a [`PacedPool`].
pub type MyPool = PacedPool<MySql>;

/// Opens a pool for a worker or a command on `db.url`.
pub async fn connect(
    db: &StoreSettings,
    bounds: &Bounds,
    _application_name: &str,
) -> Result<MyPool, StoreError> {
    let url = db.url.as_str();
    let connect_err = |cause| StoreError::Connect {
        backend: BackendKind::MySql,
        url: shown(url),
        cause,
    };
    // sqlx knows the scheme as mysql://; mariadb:// names the same protocol.
    let parseable = match url.strip_prefix("mariadb://") {
        Some(rest) => format!("mysql://{rest}"),
        None => url.to_string(),
    };
    let options: MySqlConnectOptions = parseable.parse().map_err(connect_err)?;
    let (port, dead_after) = (options.get_port(), db.dead_peer_timeout);
    let session = session_settings(db);
    // One connection first, by hand, for the cause of a failure.
    paced::first_connection::<MySqlConnection>(
        &options,
        db.connect_timeout,
        BackendKind::MySql,
        url,
    )
    .await?;
    let opened = Stamp::default();
    let opening = opened.clone();
    let switchover = bounds.switchover();
    let pool = MySqlPoolOptions::new()
        .max_connections(db.max_connections)
        .min_connections(0)
        .acquire_timeout(db.connect_timeout)
        .acquire_slow_threshold(db.connect_timeout)
        .after_connect(move |conn, _meta| {
            opening.mark();
            let session = session.clone();
            Box::pin(async move {
                crate::net::harden_connections_to(port, dead_after);
                sqlx::raw_sql(sqlx::AssertSqlSafe(session))
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            })
        });
    let pool = paced::checked(pool, switchover).connect_lazy_with(options);
    Ok(PacedPool::new(pool, opened))
}

/// What every connection sets for its session.
fn session_settings(db: &StoreSettings) -> String {
    // A lock wait gives up on the server when the client has (the store
    // bounds every statement by query_timeout), so an abandoned statement
    // does not go on holding or waiting for locks.
    let lock_wait = db.query_timeout.as_secs().max(1);
    format!(
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; \
         SET SESSION innodb_lock_wait_timeout = {lock_wait}"
    )
}
