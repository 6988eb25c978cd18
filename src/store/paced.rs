//! A sqlx pool whose statements share the connections it has while it
//! grows in the background, paced, and backs off when the server refuses
//! another connection (PostgreSQL's and MariaDB's pools; SQLite's is one
//! file).
//!
//! sqlx's own pool opens a connection inside the statement that found none
//! idle, and behind a server out of connections (`too many clients`,
//! `Too many connections`) it retries that opening, with a growing delay,
//! for the whole acquire timeout — then the statement fails, although the
//! connections it already had came free every millisecond; every waiting
//! statement of every worker did so at once. [`PacedPool::acquire`]
//! instead:
//!
//! - takes an idle connection when there is one (through sqlx's own
//!   acquisition, which checks it — [`checked`]: pinged only after a
//!   second idle — one acquisition at a time, so that one which lost the
//!   race for it does not open a connection instead);
//! - waits up to [`PATIENCE`] for a connection on its way back (sqlx pings
//!   every released connection before it is idle again), so a task's
//!   back-to-back statements reuse one connection and an idle worker keeps
//!   one ([`crate::store::trim`]);
//! - once the pool has a connection, never opens one itself: it waits for
//!   one to be released while [`PacedPool::grow`] opens more in the
//!   background, at most one start per [`GROWTH_SPACING`] times the pool's
//!   size (a burst of short statements — a worker's start-up, a fleet's
//!   rebalance — is served by the connections the pool has, rather than
//!   growing to `max_connections` for a moment's work: sixty-four workers
//!   starting at once took every connection a 300-connection server had;
//!   under steady load the pool still reaches ten within five seconds).
//!
//! A background opening adds a connection only while every connection is
//! in use ([`open_one`]): sqlx's acquisition, which it opens with, takes an
//! idle connection when there is one. A small pool waits a moment for
//! that; a larger one does not (a fleet's bursts grew every pool to ten).
//!
//! Each opening starts with one attempt by hand ([`probe`]): a refusal is
//! known after one attempt (then the pool makes one attempt at a time, each
//! after a pause of 1 s doubling to [`MAX_PAUSE`], with one warning each),
//! while a slow link's openings may overlap, up to [`MAX_OPENINGS`]. With
//! no connection at all it is sqlx's own acquisition, one at a time (the
//! first connection is opened once, not by every statement that started
//! with the worker), and at `max_connections` too (which queues for a
//! released one). It gives up with sqlx's `PoolTimedOut` after the pool's
//! acquire timeout, as sqlx would.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use sqlx::pool::{PoolConnection, PoolOptions};
use sqlx::{Connection, Database, Either, Execute, Executor, Pool, SqlStr};

use crate::stamp::Stamp;
use crate::store::error::StoreError;
use crate::store::settings::{BackendKind, shown};
use crate::store::switchover::Switchover;
use crate::store::trim;

/// How long an acquisition waits for a connection on its way back to the
/// pool (the round trip of sqlx's release ping) before the pool opens
/// another.
const PATIENCE: Duration = Duration::from_millis(3);
/// The least time between two connections the pool opens, per
/// connection it has: 100 ms after the first, 200 ms after the second, …
/// (4.5 s from one to ten).
const GROWTH_SPACING: Duration = Duration::from_millis(100);
/// The longest pause after failed openings (the first pause is 1 s).
const MAX_PAUSE: Duration = Duration::from_secs(30);
/// The most openings under way at once. Behind a slow link several overlap
/// (one at a time left a host behind a 300 ms link short of connections);
/// a server slow to take connections, as a loaded machine's is, answers
/// none for seconds, and a worker that started one more every 100–200 ms
/// meanwhile had twenty-five waiting, each a backend the server had yet to
/// start, before the first gave up.
const MAX_OPENINGS: usize = 4;
/// How long a background opening whose probe was accepted waits for every
/// connection to be in use before it opens one ([`open_one`]), while the
/// pool has fewer than [`PATIENT_BELOW`] connections.
const DEMAND_WAIT: Duration = Duration::from_millis(100);
/// The pool size from which a background opening no longer waits for
/// demand ([`open_one`]): a worker's `LISTEN` connection and three for
/// statements.
const PATIENT_BELOW: u32 = 4;
/// How often a waiting acquisition looks for a released connection.
const LOOK_EVERY: Duration = Duration::from_micros(500);
/// How long a connection may sit idle before it is pinged when acquired
/// ([`checked`]).
pub const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// `options` with the checks an idle connection passes before it is
/// handed out: not opened before the database was last seen read-only
/// ([`Switchover`]: such a connection is closed instead), and answering a
/// ping if it sat idle for [`PING_AFTER_IDLE`] or more. sqlx pings every
/// idle connection it hands out by default: a round trip per statement, on
/// top of the ping every released connection gets before it is idle again
/// — which already tests a connection that is handed out again within a
/// second. (A connection that died since then fails its statement, which
/// the store retries as any lost connection.)
pub(crate) fn checked<DB: Database>(
    options: PoolOptions<DB>,
    switchover: Arc<Switchover>,
) -> PoolOptions<DB> {
    options
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            let fresh = !switchover.opened_before_stale(meta.age);
            Box::pin(async move {
                if fresh && meta.idle_for >= PING_AFTER_IDLE {
                    conn.ping().await?;
                }
                Ok(fresh)
            })
        })
}

/// A sqlx pool with paced growth (see the module docs), and a sqlx
/// executor like `&Pool` (each statement on a connection of
/// [`PacedPool::acquire`]). Cheap to clone.
#[derive(Debug)]
pub struct PacedPool<DB: Database> {
    inner: Pool<DB>,
    /// How many of the pool's connections this wrapper has handed out and
    /// not yet given back (see [`PacedPool::acquire`]).
    lent: Arc<AtomicUsize>,
    /// The pool's background openings ([`PacedPool::grow`]).
    growth: Arc<std::sync::Mutex<Growth>>,
    /// Held by the one acquisition that opens the pool's first connection.
    first: Arc<tokio::sync::Mutex<()>>,
    /// Held by an acquisition that takes an idle connection.
    taking: Arc<tokio::sync::Mutex<()>>,
    /// When the server last refused the pool a connection
    /// ([`PacedPool::grow`]; [`crate::store::trim`] gives idle ones back
    /// sooner after it).
    refused: Stamp,
}

impl<DB: Database> Clone for PacedPool<DB> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            lent: self.lent.clone(),
            growth: self.growth.clone(),
            first: self.first.clone(),
            taking: self.taking.clone(),
            refused: self.refused.clone(),
        }
    }
}

/// The pool's openings under way, and when it may start the next.
#[derive(Debug)]
struct Growth {
    /// Openings under way.
    opening: usize,
    /// The next opening starts no sooner than this.
    next: Instant,
    /// Openings that failed in a row (the pause after the next failure
    /// doubles with each).
    failures: u32,
}

/// A lent connection's mark: counted in [`PacedPool::lent`] until dropped.
#[derive(Debug)]
pub struct Lent(Arc<AtomicUsize>);

impl Lent {
    fn new(lent: &Arc<AtomicUsize>) -> Self {
        lent.fetch_add(1, Ordering::Relaxed);
        Lent(lent.clone())
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<DB: Database> PacedPool<DB> {
    /// Paces `inner` (a lazily connecting pool: its acquire timeout bounds
    /// each acquisition), and trims it ([`crate::store::trim`]); `opened`
    /// is marked by `inner`'s `after_connect` hook.
    pub fn new(inner: Pool<DB>, opened: Stamp) -> Self {
        let refused = Stamp::never();
        trim::spawn(inner.clone(), opened, refused.clone());
        Self {
            inner,
            lent: Arc::default(),
            growth: Arc::new(std::sync::Mutex::new(Growth {
                opening: 0,
                next: Instant::now(),
                failures: 0,
            })),
            first: Arc::default(),
            taking: Arc::default(),
            refused,
        }
    }

    /// The sqlx pool underneath.
    pub fn sqlx(&self) -> &Pool<DB> {
        &self.inner
    }

    /// A connection: an idle one (checked as sqlx checks any); else the
    /// first one released, while the pool grows in the background once
    /// this acquisition has waited [`PATIENCE`] or nothing is on its way
    /// back. With no connection at all (one acquisition at a time), or at
    /// `max_connections`, sqlx's own acquisition. Gives up with
    /// `PoolTimedOut` after the pool's acquire timeout.
    pub async fn acquire(&self) -> Result<(PoolConnection<DB>, Lent), sqlx::Error> {
        let started = Instant::now();
        let options = self.inner.options();
        let (max, timeout) = (options.get_max_connections(), options.get_acquire_timeout());
        loop {
            if self.inner.num_idle() > 0 {
                // Taken by sqlx's `acquire`, which runs the pool's checks on
                // it ([`checked`]; `try_acquire` would skip them, and hand a
                // connection to an old primary out again), one acquisition
                // at a time: two that saw the same idle connection would
                // both go to sqlx, and the one that found it gone would
                // open a connection itself, refused by a server out of
                // them.
                let left = timeout.saturating_sub(started.elapsed());
                let Ok(taking) = tokio::time::timeout(left, self.taking.lock()).await else {
                    return Err(sqlx::Error::PoolTimedOut);
                };
                if self.inner.num_idle() > 0 {
                    let conn = self.inner.acquire().await;
                    drop(taking);
                    return Ok((conn?, self.lend()));
                }
                continue;
            }
            let size = self.inner.size();
            if size >= max || self.inner.is_closed() {
                break;
            }
            if size == 0 {
                // One acquisition at a time opens the first connection (the
                // others wait for it, then share it while the pool grows):
                // a worker's buckets all start at once, and each opened a
                // connection of its own, or each failed or retried for
                // want of one from a server out of connections.
                let left = timeout.saturating_sub(started.elapsed());
                let Ok(_first) = tokio::time::timeout(left, self.first.lock()).await else {
                    return Err(sqlx::Error::PoolTimedOut);
                };
                if self.inner.size() == 0 {
                    return Ok((self.inner.acquire().await?, self.lend()));
                }
                continue;
            }
            let in_use = (size as usize).saturating_sub(self.inner.num_idle());
            let returning = in_use.saturating_sub(self.lent.load(Ordering::Relaxed));
            let waited = started.elapsed();
            if returning == 0 || waited >= PATIENCE {
                self.grow(size);
            }
            if waited >= timeout {
                return Err(sqlx::Error::PoolTimedOut);
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
        Ok((self.inner.acquire().await?, self.lend()))
    }

    /// Starts a transaction, its connection counted as lent while the mark
    /// lives.
    pub async fn begin(&self) -> Result<(sqlx::Transaction<'static, DB>, Lent), sqlx::Error> {
        let (conn, lent) = self.acquire().await?;
        Ok((sqlx::Transaction::begin(conn, None).await?, lent))
    }

    /// Closes every connection.
    pub async fn close(&self) {
        self.inner.close().await
    }

    /// Starts a background opening, unless it is too soon after the last
    /// one started ([`GROWTH_SPACING`] times `size`), [`MAX_OPENINGS`] are
    /// under way or, after a failed one, while another is under way or the
    /// pause lasts. The opened connection goes to the pool's idle ones,
    /// where a waiting acquisition takes it. (Openings may overlap while
    /// none fails: behind a slow link each takes seconds.)
    fn grow(&self, size: u32) {
        let mut growth = self.growth.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let most = if growth.failures > 0 { 1 } else { MAX_OPENINGS };
        if now < growth.next || growth.opening >= most {
            return;
        }
        growth.opening += 1;
        growth.next = now + GROWTH_SPACING * size.max(1);
        drop(growth);
        let (pool, growth) = (self.inner.clone(), self.growth.clone());
        let refused = self.refused.clone();
        tokio::spawn(async move {
            let opened = match probe(&pool).await {
                Ok(()) => open_one(&pool).await,
                Err(e) => Err(e),
            };
            let mut growth = growth.lock().unwrap_or_else(|e| e.into_inner());
            growth.opening -= 1;
            match opened {
                Ok(opened) => {
                    growth.failures = 0;
                    tracing::debug!(
                        opened,
                        size = pool.size(),
                        "the pool's background opening ended"
                    );
                }
                Err(_) if pool.is_closed() => {}
                Err(error) => {
                    // The server answered, and said no (out of connections,
                    // as a rule): not a slow or broken link.
                    if matches!(error, sqlx::Error::Database(_)) {
                        refused.mark();
                    }
                    growth.failures = growth.failures.saturating_add(1);
                    let pause = Duration::from_secs(1)
                        .saturating_mul(1 << (growth.failures - 1).min(5))
                        .min(MAX_PAUSE);
                    growth.next = growth.next.max(Instant::now() + pause);
                    tracing::warn!(
                        %error,
                        failures = growth.failures,
                        pause_ms = pause.as_millis() as u64,
                        "the database connection pool could not open another connection; \
                         its statements share the connections it has until the pause ends"
                    );
                }
            }
        });
    }

    /// Counts a connection taken from the pool by other means (for good:
    /// PostgreSQL's `LISTEN` connection) as lent while the mark lives.
    pub(crate) fn lend(&self) -> Lent {
        Lent::new(&self.lent)
    }
}

impl<'p, DB: Database> Executor<'p> for &'_ PacedPool<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    type Database = DB;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<DB::QueryResult, DB::Row>, sqlx::Error>>
    where
        E: 'q + Execute<'q, DB>,
    {
        let pool = self.clone();
        let rows = async move {
            let (mut conn, _lent) = pool.acquire().await?;
            conn.fetch_many(query).try_collect::<Vec<_>>().await
        };
        futures_util::stream::once(rows)
            .map_ok(|rows| futures_util::stream::iter(rows.into_iter().map(Ok)))
            .try_flatten()
            .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<DB::Row>, sqlx::Error>>
    where
        E: 'q + Execute<'q, DB>,
    {
        let pool = self.clone();
        Box::pin(async move {
            let (mut conn, _lent) = pool.acquire().await?;
            conn.fetch_optional(query).await
        })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [DB::TypeInfo],
    ) -> BoxFuture<'e, Result<DB::Statement, sqlx::Error>>
    where
        'p: 'e,
    {
        let pool = self.inner.clone();
        Box::pin(async move { (&pool).prepare_with(sql, parameters).await })
    }

    #[doc(hidden)]
    fn describe<'e>(self, sql: SqlStr) -> BoxFuture<'e, Result<sqlx::Describe<DB>, sqlx::Error>> {
        let pool = self.inner.clone();
        Box::pin(async move { (&pool).describe(sql).await })
    }
}

/// After a probe the server accepted, one more connection for the pool —
/// opened by sqlx's acquisition, which takes an idle connection instead
/// when there is one: the probe takes a handshake (8–25 ms on a loaded
/// machine), and a connection that came back meanwhile was taken and
/// released again (a round trip, sqlx's release ping) and the pool did not
/// grow — two growths in three under a trickle of 500 messages a second,
/// whose pool stayed at three connections, probing a fourth every 350 ms.
/// So a pool of fewer than [`PATIENT_BELOW`] connections waits, up to
/// [`DEMAND_WAIT`], for a moment when every connection is in use, and then
/// asks sqlx (true); none: the statements no longer need another (false).
/// A larger pool opens one only if every connection is in use when the
/// probe is accepted: bursts — a fleet's cold start, its rebalances — find
/// such a moment in every pool, and sixty-four workers that each waited
/// for it grew to ten connections apiece and filled a 300-connection
/// server, the last workers to start (or to join) refused for the 30 s the
/// others took to shrink.
async fn open_one<DB: Database>(pool: &Pool<DB>) -> Result<bool, sqlx::Error> {
    // Openings overlap: the pool may have reached its size meanwhile.
    if full(pool) {
        return Ok(false);
    }
    let wait = if pool.size() < PATIENT_BELOW {
        DEMAND_WAIT
    } else {
        Duration::ZERO
    };
    let until = Instant::now() + wait;
    while pool.num_idle() > 0 {
        if Instant::now() >= until {
            return Ok(false);
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
    match pool.acquire().await {
        // The pool may have reached its size meanwhile (openings overlap):
        // then sqlx's acquire only queued behind the statements for a
        // connection already there, and timed out — no refusal.
        Err(sqlx::Error::PoolTimedOut) if full(pool) => Ok(false),
        opened => opened.map(|_| true),
    }
}

/// Whether the pool holds as many connections as it may.
fn full<DB: Database>(pool: &Pool<DB>) -> bool {
    pool.size() >= pool.options().get_max_connections()
}

/// One attempt to connect, by hand, before the pool opens a connection
/// itself: sqlx's pool retries a refused opening for the acquire timeout
/// without a word, and a slow link's opening takes as long as that; this
/// attempt tells them apart at once, so a refused pool pauses after a
/// single attempt while openings behind a slow link may overlap. It costs
/// a second handshake per connection the pool adds.
async fn probe<DB: Database>(pool: &Pool<DB>) -> Result<(), sqlx::Error> {
    let timeout = pool.options().get_acquire_timeout();
    connect_once::<DB::Connection>(&pool.connect_options(), timeout)
        .await
        .map_err(|e| e.unwrap_or(sqlx::Error::PoolTimedOut))
}

/// A backend's first connection to `url` ([`connect_once`]), its failure
/// said as the store says it: the cause, or no answer within `timeout`.
pub(crate) async fn first_connection<C: Connection>(
    options: &C::Options,
    timeout: Duration,
    backend: BackendKind,
    url: &str,
) -> Result<(), StoreError> {
    connect_once::<C>(options, timeout)
        .await
        .map_err(|e| match e {
            Some(cause) => StoreError::Connect {
                backend,
                url: shown(url),
                cause,
            },
            None => StoreError::ConnectTimeout {
                backend,
                url: shown(url),
                after: timeout,
            },
        })
}

/// One connection, opened by hand and closed at once: the pool's probe, and
/// each backend's first connection (a pool reports every failure to connect
/// as "pool timed out", and the cause is what the operator needs). `None`:
/// no answer within `timeout`.
pub(crate) async fn connect_once<C: Connection>(
    options: &C::Options,
    timeout: Duration,
) -> Result<(), Option<sqlx::Error>> {
    match tokio::time::timeout(timeout, C::connect_with(options)).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            Ok(())
        }
        Ok(Err(e)) => Err(Some(e)),
        Err(_) => Err(None),
    }
}
