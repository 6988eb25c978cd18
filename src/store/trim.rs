//! Gives back the connections a burst opened.
//!
//! sqlx hands out idle connections first in, first out, so a pool that
//! grew to `max_connections` once (a worker's start-up, when every bucket
//! claims at the same moment) keeps every connection warm for ever, even
//! when one would do: an idle worker held all ten, and a few dozen idle
//! workers exhausted a database. This task closes one idle connection per
//! second while the pool is larger than its recent demand — the most
//! connections in use at once in the last [`QUIET`] (sampled every 100 ms),
//! and at least one more than were always in use — and no connection had
//! to be opened in the last [`AFTER_OPENING`]. Under load the pool is as
//! large as the load needs; idle, it shrinks back to one connection (and,
//! on PostgreSQL, the `LISTEN` connection, which sqlx counts in the pool as
//! one always in use).
//!
//! Within [`SCARCE_FOR`] of the server refusing this pool a connection, the
//! server is out of them and other workers (the last to start, or to join)
//! may have none at all: then demand is what was in use in the last
//! [`QUIET_SCARCE`], and every sample may close a connection (once none
//! was opened for as long) — a fleet's burst no longer holds a full server
//! for [`QUIET`].
//!
//! One spare is enough because the pools' statements wait for a connection
//! on its way back ([`crate::store::paced`]): sqlx pings a released
//! connection before it is idle again (a round trip), so a task that runs
//! two statements back to back — the coordinator's membership read, then
//! its renew — would otherwise find the first still on its way back and
//! open another (a plain sqlx pool kept one, and reopened a connection
//! every few seconds; MariaDB's kept two until its pool was paced too).

use std::time::Duration;

use tokio::time::Instant;

use crate::stamp::Stamp;

/// How long demand must stay below the pool's size before it shrinks.
pub const QUIET: Duration = Duration::from_secs(30);
/// [`QUIET`] while the server is short of connections.
const QUIET_SCARCE: Duration = Duration::from_secs(2);
/// How long after the server refused the pool a connection it counts as
/// short of them.
const SCARCE_FOR: Duration = Duration::from_secs(60);
/// How long after the pool last had to open a connection it may shrink:
/// a spell of load grows it, the end of the spell shrinks it, but no more
/// often than this (a stray overlap of two statements on an idle worker
/// opens a connection that lives this long).
const AFTER_OPENING: Duration = Duration::from_secs(5);
/// How often the connections in use are counted.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// How often one idle connection may be closed.
const CLOSE_EVERY: Duration = Duration::from_secs(1);

/// Trims `pool` down to its demand (see the module docs) until it closes.
/// `opened` is when the pool last opened a connection (its `after_connect`
/// hook marks it), `refused` when the server last refused it one.
pub(crate) fn spawn<DB: sqlx::Database>(pool: sqlx::Pool<DB>, opened: Stamp, refused: Stamp) {
    tokio::spawn(async move {
        // (connections, since when): the most and the fewest in use.
        let mut peak = (0u32, Instant::now());
        let mut floor = (u32::MAX, Instant::now());
        let mut next_close = Instant::now() + CLOSE_EVERY;
        while !pool.is_closed() {
            tokio::time::sleep(SAMPLE_EVERY).await;
            let scarce = refused.ago() < SCARCE_FOR;
            let quiet = if scarce { QUIET_SCARCE } else { QUIET };
            let in_use = pool.size().saturating_sub(pool.num_idle() as u32);
            if in_use >= peak.0 || peak.1.elapsed() > quiet {
                peak = (in_use, Instant::now());
            }
            if in_use <= floor.0 || floor.1.elapsed() > quiet {
                floor = (in_use, Instant::now());
            }
            if Instant::now() < next_close && !scarce {
                continue;
            }
            next_close = Instant::now() + CLOSE_EVERY;
            let wanted = peak.0.max(floor.0 + 1);
            if pool.size() > wanted
                && opened.ago() > AFTER_OPENING.min(quiet)
                && let Some(idle) = pool.try_acquire()
            {
                let _ = idle.close().await;
            }
        }
    });
}
