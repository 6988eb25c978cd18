//! SQLite: the connection pool on the database file.
//!
//! Every connection uses WAL mode (readers and the writer do not block
//! each other; the whole fleet of one host shares the file), waits for the
//! write lock up to `database.query_timeout` (in steps of 100 µs, see
//! [`wait_for_the_lock`]) and
//! writes with `synchronous = NORMAL` (see [`super`]). The file is created
//! when missing, so `outboxd migrate` can start a deployment from nothing.
//! Writes go through one connection that never checkpoints the WAL; a
//! background task does, once a second, beside the writes, and keeps the
//! WAL file near [`WAL_LIMIT`] (see [`checkpoints`]).

use std::str::FromStr;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection};

use crate::store::error::StoreError;
use crate::store::settings::StoreSettings;
use crate::store::settings::{BackendKind, shown};

/// Opens the pools on the file `db.url` names (`sqlite://path`): readers
/// (up to `database.max_connections`) and the writer (one connection).
/// Also returns the database file's path, absolute.
pub async fn connect(
    db: &StoreSettings,
) -> Result<(SqlitePool, SqlitePool, std::path::PathBuf), StoreError> {
    let url = db.url.as_str();
    let connect_err = |cause| StoreError::Connect {
        backend: BackendKind::Sqlite,
        url: shown(url),
        cause,
    };
    let options = SqliteConnectOptions::from_str(url)
        .map_err(connect_err)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(db.query_timeout);
    // One connection first, by hand: a pool reports every failure to open
    // as "pool timed out", and the cause is what the operator needs.
    let first = tokio::time::timeout(db.connect_timeout, options.connect())
        .await
        .map_err(|_| StoreError::ConnectTimeout {
            backend: BackendKind::Sqlite,
            url: shown(url),
            after: db.connect_timeout,
        })?
        .map_err(connect_err)?;
    let _ = first.close().await;
    let limit_ms = db.query_timeout.as_millis().min(i32::MAX as u128) as usize;
    let pool = |max, options: SqliteConnectOptions, limit_ms: usize| {
        SqlitePoolOptions::new()
            .max_connections(max)
            .min_connections(0)
            // A file has no link to go stale: no round trip to the
            // connection's thread before each statement.
            .test_before_acquire(false)
            .acquire_timeout(db.connect_timeout.max(db.query_timeout))
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    let mut handle = conn.lock_handle().await?;
                    let db = handle.as_raw_handle().as_ptr();
                    // SAFETY: the connection is locked for this call, and
                    // the handler's argument is a number, not a pointer.
                    unsafe {
                        libsqlite3_sys::sqlite3_busy_handler(
                            db,
                            Some(wait_for_the_lock),
                            limit_ms as *mut std::ffi::c_void,
                        )
                    };
                    Ok(())
                })
            })
            .connect_lazy_with(options)
    };
    let file = std::env::current_dir()
        .unwrap_or_default()
        .join(options.get_filename());
    let readers = pool(db.max_connections, options.clone(), limit_ms);
    // The writer never checkpoints in a commit (a checkpoint writes the
    // database file and syncs it: tens of ms in the middle of a claim);
    // a connection of its own does it beside the writes instead, and waits
    // for other connections at most CHECKPOINT_PATIENCE.
    let writer = pool(
        1,
        options.clone().pragma("wal_autocheckpoint", "0"),
        limit_ms,
    );
    let checkpointer = pool(1, options, CHECKPOINT_PATIENCE.as_millis() as usize);
    let mut wal = file.clone().into_os_string();
    wal.push("-wal");
    tokio::spawn(checkpoints(readers.clone(), checkpointer, wal.into()));
    Ok((readers, writer, file))
}

/// SQLite's busy handler: how a statement waits while another connection
/// (a producer's commit, another worker) holds the write lock. SQLite's own
/// (`busy_timeout`) sleeps 1, 2, 5, 10, 15, 20, 25… ms between tries, so a
/// wait for a commit of a fraction of a millisecond often costs 5–25 ms;
/// this one tries every 100 µs for the first 10 ms, then every ms, and
/// gives up after `limit_ms` (`database.query_timeout`, the argument):
/// the statement then fails as busy, which is transient.
extern "C" fn wait_for_the_lock(
    limit_ms: *mut std::ffi::c_void,
    tries: std::ffi::c_int,
) -> std::ffi::c_int {
    let tries = tries.max(0) as usize;
    let (fine, waited_ms) = if tries < 100 {
        (true, tries / 10)
    } else {
        (false, 10 + (tries - 100))
    };
    if waited_ms >= limit_ms as usize {
        return 0;
    }
    std::thread::sleep(std::time::Duration::from_micros(if fine {
        100
    } else {
        1000
    }));
    1
}

/// How often the WAL is copied back into the database file.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The WAL file's size past which the next checkpoint truncates it.
pub const WAL_LIMIT: u64 = 64 << 20;

/// How long a truncating checkpoint waits for the writer and for readers
/// of the WAL (its busy handler's limit), holding off new writers
/// meanwhile.
const CHECKPOINT_PATIENCE: std::time::Duration = std::time::Duration::from_millis(100);

/// Copies the WAL back into the database file every [`CHECKPOINT_EVERY`],
/// on the checkpointer's connection, until the readers' pool closes.
///
/// A passive checkpoint takes no lock a writer waits for: commits go on
/// meanwhile, and what a reader still uses is left for the next one. But
/// SQLite starts the WAL over only when a write finds it wholly copied
/// back, and under a steady stream of commits (a drain records a batch
/// every few milliseconds) it never is: the file grew to 840 MB while one
/// worker drained 200,000 rows, and stays that large on disk. So once the
/// file passes [`WAL_LIMIT`] the checkpoint is `TRUNCATE`: it waits for
/// the writer between two commits, copies the rest, waits for the WAL's
/// readers, and empties the file — holding off writers for at most
/// [`CHECKPOINT_PATIENCE`] per wait plus the copy of about a second of
/// frames. If readers outlast its patience it gives up (busy) and is tried
/// again a second later.
async fn checkpoints(readers: SqlitePool, checkpointer: SqlitePool, wal: std::path::PathBuf) {
    let mut every = tokio::time::interval(CHECKPOINT_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if readers.is_closed() {
            checkpointer.close().await;
            return;
        }
        let large = std::fs::metadata(&wal).is_ok_and(|m| m.len() > WAL_LIMIT);
        let statement = if large {
            "PRAGMA wal_checkpoint(TRUNCATE)"
        } else {
            "PRAGMA wal_checkpoint(PASSIVE)"
        };
        if let Err(e) = sqlx::query(statement).execute(&checkpointer).await {
            tracing::debug!(error = %e, "WAL checkpoint failed (tried again in a second)");
        }
    }
}
