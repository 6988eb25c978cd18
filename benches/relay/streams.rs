//! Section 15 (`--only streams`): the relay into a RabbitMQ stream, beside
//! what bounds it, in the same run. Per round and per batch size (100 and
//! 1,000; every arm's worker claims that many rows at a time, to a stream
//! as to a queue), seven arms in turn, their order alternating:
//!
//! - **bare stream publisher** — the ceiling: no database; this process
//!   sends the same messages (built by the relay's own
//!   `stream_message`) through 16 named producers on one connection, one
//!   per bucket, each a batch in flight and awaiting its confirms, with the
//!   broker's de-duplication on (publishing ids 1..n);
//! - **relay to a stream** — one worker draining n seeded rows on
//!   PostgreSQL into a fresh stream;
//! - **relay to a queue** — the same worker and rows into a classic queue
//!   (section 1's path);
//! - **claim and record alone** — the floor under any relay that keeps G1:
//!   the same rows claimed and recorded published by the relay's own
//!   statements (no lease fence, no broker), 16 buckets at once, each
//!   claim followed by the record of what it read;
//! - **relay to a stream, rows deleted on publish** — the relay to a
//!   stream with `outbox.keep_published = false`: the cheapest record G1
//!   allows (a `DELETE` instead of an `UPDATE`);
//! - **the database alone, inside PostgreSQL** — the floor under any relay
//!   that records each row, however written: a procedure reads each
//!   bucket's rows from the pending index in `id` order and deletes them,
//!   a commit per batch, 16 buckets at once; no client, no network;
//! - **the cheapest client** — the floor under any relay that reads its
//!   rows out of the database over a connection and records each: one
//!   statement a batch deletes a bucket's next rows (read from the pending
//!   index in `id` order) and returns what a message is built from,
//!   decoded in this process, 16 buckets at once on 16 connections; no
//!   claim, no lease, no broker.
//!
//! A relay's arm is timed from the worker's first record to its last, as
//! the bare publisher's is timed once it is connected (the rate from the
//! worker's spawn is printed beside it). Each arm also reports how busy the
//! machine's cores were while it was timed. From the bare publisher and the
//! database alone, the section derives the most any relay could reach on
//! these cores: a message costs a relay at least the CPU time the database
//! alone spends on a row plus what the bare publisher and the broker spend
//! on a message (busy share ÷ rate, same round), so its rate is at most 1 ÷
//! that sum: 0.75 × the bare publisher is within reach only where the sum
//! is at most 1.33 ÷ the bare publisher's rate. The same with the cheapest
//! client in place of the database alone gives the most a relay that
//! reads its rows over a connection could reach.
//!
//! At batch 100 one more arm: **relay to a stream at the defaults** —
//! claims of `outbox.batch_size` (100), then of `outbox.stream_batch_size`
//! (1,000) while a bucket's rows go to streams — against the queue at
//! batch 100, which is the queue's default.
//!
//! With `OUTBOXD_BENCH_BASELINE_BIN=<another outboxd>`, one more arm: the
//! relay to a stream on that build, in the same rounds, given
//! `outbox.batch_size` alone.
//!
//! Then the trickle: 50 messages a second, one per transaction, timed
//! from just before the `INSERT` to the delivery, to a stream (a
//! subscriber reading from the stream's end) beside a queue (a consumer),
//! one worker each: four rounds of 250 messages (50 with `--quick`), stream
//! and queue in turn, the order alternating, each round after five
//! messages not counted (the worker's first claims after its start).
//!
//! Last, a takeover's look-up (`outboxd::stream::gather`) on a busy
//! stream: how long reading a million messages stored since the rows in
//! question were created takes, for one bucket and for 16 at once; and
//! for one bucket asking about a row below every id it holds (a row that
//! committed late and was never sent), which makes the read look as if
//! it started too late and reads the stream from further back.
//!
//! Targets (issue text, same run): relay to a stream ≥ 0.75 × the bare
//! stream publisher and ≥ 3 × the relay to a queue (each at its defaults);
//! the trickle's p99 to a stream within 1.5 × the queue's.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use outboxd::config::{Config, DEFAULT_BATCH_SIZE};
use outboxd::partitioner::Partitioner;
use outboxd::producer::{Message, Producer};
use outboxd::relay::RelaySettings;
use outboxd::sink::PublishLimits;
use outboxd::store::Store;
use outboxd::store::outbox::{Claim, ClaimToken, Holder, Published};
use outboxd::stream::gather::Gather;
use outboxd::stream::message::stream_message;
use outboxd::stream::{Confirm, OffsetSpecification, StreamClient, StreamUrl};
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection as _, PgConnection};

use super::{
    BUCKETS, Backend, Bench, KEYS, PAYLOAD, claimed_row, drained_rate, median_of, ms, pct, pg,
    spawn_bin,
};

const WAIT: Duration = Duration::from_secs(30);

/// The procedure of [`Bench::inside_the_database`]: drains one bucket
/// (`bucket`), `batch` rows at a time, read as a relay's claim reads
/// them (the pending index, `id` order) and recorded with the cheapest
/// record G1 allows.
const DRAIN_INSIDE: &str = "CREATE PROCEDURE outboxd_bench_drain(bucket text, batch int)
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
BEGIN
    LOOP
        SELECT array_agg(id ORDER BY id) INTO ids FROM (
            SELECT id FROM outbox
            WHERE partition_key BETWEEN bucket AND bucket
              AND published_at IS NULL AND failed_at IS NULL
            ORDER BY partition_key, id
            LIMIT batch
        ) head;
        EXIT WHEN ids IS NULL;
        DELETE FROM outbox WHERE id = ANY(ids) AND partition_key = bucket AND published_at IS NULL;
        COMMIT;
    END LOOP;
END $$";

/// The statement of [`Bench::cheapest_client`]: a bucket's next `$2`
/// rows, read from the pending index in `id` order, deleted and returned
/// with what a message is built from, in one statement.
const TAKE_AND_DELETE: &str = "DELETE FROM outbox WHERE id IN (
        SELECT id FROM outbox
        WHERE partition_key BETWEEN $1 AND $1
          AND published_at IS NULL AND failed_at IS NULL
        ORDER BY partition_key, id
        LIMIT $2)
    RETURNING id, message_key, exchange, routing_key, message_id, headers, content_type, payload, created_at";

/// What [`TAKE_AND_DELETE`] returns of a row, decoded as a relay would.
type TakenRow = (
    i64,
    String,
    String,
    String,
    uuid::Uuid,
    serde_json::Value,
    Option<String>,
    Vec<u8>,
    chrono::DateTime<chrono::Utc>,
);

/// The trickle's rounds, stream and queue in turn.
const TRICKLE_ROUNDS: usize = 4;
/// The first messages of a round, not counted: a worker's first claims
/// and publishes after its start take 7–12 ms, to a stream and to a queue
/// alike, where the rest of the trickle takes 3.
const TRICKLE_WARM_UP: usize = 5;

/// The arms of a round, by index, and their names.
const BARE: usize = 0;
const STREAM: usize = 1;
const QUEUE: usize = 2;
const CLAIM_AND_RECORD: usize = 3;
const DELETING: usize = 4;
const INSIDE: usize = 5;
const CLIENT: usize = 6;
const DEFAULTS: usize = 7;
const BASELINE: usize = 8;
const ARM_NAMES: [&str; 9] = [
    "bare stream publisher",
    "relay to a stream",
    "relay to a queue",
    "claim and record alone",
    "relay to a stream, rows deleted on publish",
    "the database alone, inside PostgreSQL",
    "the cheapest client: taken and deleted",
    "relay to a stream at the defaults",
    "relay to a stream, baseline build",
];

/// How many rows an arm's worker claims at a time.
#[derive(Clone, Copy)]
enum Claims {
    /// `batch` rows whatever the sink (`outbox.batch_size` and
    /// `outbox.stream_batch_size`): the sweep compares arms at one size.
    Each(u32),
    /// `outbox.batch_size` alone, for a build that may not know
    /// `outbox.stream_batch_size` (one that does claims that many while
    /// its rows go to streams).
    BatchSize(u32),
    /// The defaults: 100, then 1,000 while a bucket's rows go to streams.
    Defaults,
}

impl Claims {
    fn toml(self) -> String {
        match self {
            Claims::Each(b) => format!("batch_size = {b}\nstream_batch_size = {b}\n"),
            Claims::BatchSize(b) => format!("batch_size = {b}\n"),
            Claims::Defaults => String::new(),
        }
    }
}

/// An arm's rate, and the busy share of the machine's cores meanwhile.
#[derive(Clone, Copy)]
struct Arm {
    rate: f64,
    busy: f64,
    /// A relay's rate with its start counted: from the worker's spawn to
    /// its last record (the rate itself is timed from its first record);
    /// `None` for the arms that start nothing.
    with_start: Option<f64>,
}

/// An arm's clock and the machine's CPU from its start.
struct Timing {
    start: Instant,
    ticks: Option<(u64, u64)>,
}

impl Timing {
    fn start() -> Self {
        Timing {
            start: Instant::now(),
            ticks: super::machine_ticks(),
        }
    }

    /// `rate`, and how busy the cores have been since the start (NaN where
    /// `/proc/stat` cannot be read).
    fn arm(&self, rate: f64) -> Arm {
        let busy = match (self.ticks, super::machine_ticks()) {
            (Some(before), Some(after)) => super::busy_between(before, after),
            _ => f64::NAN,
        };
        Arm {
            rate,
            busy,
            with_start: None,
        }
    }
}

/// `outbox.keep_published`: the record sets `published_at` (the default)…
const KEPT: bool = true;
/// …or deletes the row (the cheaper record G1 allows).
const DELETED: bool = false;

impl Bench {
    pub(crate) async fn streams(&mut self) {
        let url = std::env::var("OUTBOXD_STREAM_URL")
            .expect("OUTBOXD_STREAM_URL is not set: run scripts/bench.sh");
        // `OUTBOXD_BENCH_STREAMS_ROWS=N` and `OUTBOXD_BENCH_STREAMS_BATCHES=a,b`
        // set the rows and the batch sizes (for a sweep of batch sizes, with
        // rows enough that every bucket claims several batches).
        let n = std::env::var("OUTBOXD_BENCH_STREAMS_ROWS")
            .ok()
            .map(|v| {
                v.parse()
                    .expect("OUTBOXD_BENCH_STREAMS_ROWS is a row count")
            })
            .unwrap_or(if self.quick { 20_000 } else { 100_000 });
        let batches: Vec<u32> = std::env::var("OUTBOXD_BENCH_STREAMS_BATCHES")
            .ok()
            .map(|v| {
                v.split(',')
                    .map(|b| {
                        b.trim()
                            .parse()
                            .expect("OUTBOXD_BENCH_STREAMS_BATCHES lists batch sizes")
                    })
                    .collect()
            })
            .unwrap_or_else(|| vec![100, 1_000]);
        let rounds = self.repeat.max(3);
        println!(
            "streams: {n} messages of {PAYLOAD} bytes over {KEYS} keys, one worker on PostgreSQL, {rounds} rounds"
        );
        let baseline = std::env::var("OUTBOXD_BENCH_BASELINE_BIN").ok();
        let this = std::path::Path::new(super::BIN);
        let mut out = serde_json::Map::new();
        for batch in batches {
            let mut arms: Vec<usize> = (BARE..=CLIENT).collect();
            // The queue at batch 100 runs at its defaults, so does this arm.
            let defaults = batch == DEFAULT_BATCH_SIZE;
            if defaults {
                arms.push(DEFAULTS);
            }
            if baseline.is_some() {
                arms.push(BASELINE);
            }
            let mut measured: Vec<Vec<Arm>> = vec![Vec::new(); ARM_NAMES.len()];
            let each_batch = Claims::Each(batch);
            for round in 0..rounds {
                let mut order = arms.clone();
                if round % 2 == 1 {
                    order.reverse();
                }
                for arm in order {
                    let result = match arm {
                        BARE => self.bare_stream(&url, n, batch).await,
                        STREAM => self.relay_to(this, Some(&url), n, each_batch, KEPT).await,
                        QUEUE => self.relay_to(this, None, n, each_batch, KEPT).await,
                        CLAIM_AND_RECORD => self.claim_and_record(n, batch).await,
                        DELETING => {
                            self.relay_to(this, Some(&url), n, each_batch, DELETED)
                                .await
                        }
                        INSIDE => self.inside_the_database(n, batch).await,
                        CLIENT => self.cheapest_client(n, batch).await,
                        DEFAULTS => {
                            self.relay_to(this, Some(&url), n, Claims::Defaults, KEPT)
                                .await
                        }
                        _ => {
                            let bin = baseline.as_deref().map(std::path::Path::new);
                            let bin = bin.expect("this arm only with a baseline build");
                            let claims = Claims::BatchSize(batch);
                            self.relay_to(bin, Some(&url), n, claims, KEPT).await
                        }
                    };
                    println!(
                        "  batch {batch}, round {round}, {}: {:.0} msg/s{}, cores {:.0} % busy",
                        ARM_NAMES[arm],
                        result.rate,
                        result
                            .with_start
                            .map(|r| format!(" ({r:.0} with the worker's start)"))
                            .unwrap_or_default(),
                        100.0 * result.busy
                    );
                    measured[arm].push(result);
                }
            }
            let rates = |arm: usize| measured[arm].iter().map(|a| a.rate).collect::<Vec<_>>();
            let (bare, stream, queue) = (rates(BARE), rates(STREAM), rates(QUEUE));
            let (database, deleting, inside) =
                (rates(CLAIM_AND_RECORD), rates(DELETING), rates(INSIDE));
            let (at_defaults, stream_baseline) = (rates(DEFAULTS), rates(BASELINE));
            // Each round's figure, "0.61 / 0.67 / 0.57".
            let joined = |v: &[f64]| {
                v.iter()
                    .map(|x| format!("{x:.2}"))
                    .collect::<Vec<_>>()
                    .join(" / ")
            };
            let each = |a: &[f64], b: &[f64]| {
                joined(&a.iter().zip(b).map(|(x, y)| x / y).collect::<Vec<_>>())
            };
            let ratios = |a: &[f64], b: &[f64]| {
                median_of(&a.iter().zip(b).map(|(x, y)| x / y).collect::<Vec<_>>())
            };
            // The most any relay that records each row could reach on these
            // cores, as a share of the bare publisher: a message costs it at
            // least the CPU the database alone spends on a row (inside
            // PostgreSQL, with the cheapest record) plus what the bare
            // publisher and the broker spend on a message, the two measured
            // as busy share ÷ rate in the same round.
            let bound_over = |floor: usize| -> Vec<f64> {
                measured[floor]
                    .iter()
                    .zip(&measured[BARE])
                    .map(|(db, b)| 1.0 / (db.busy * b.rate / db.rate + b.busy))
                    .collect()
            };
            let bounds = bound_over(INSIDE);
            // The same over the cheapest client: a relay also reads every
            // row out of the database, over a connection.
            let client_bounds = bound_over(CLIENT);
            let busy = |arm: usize| {
                100.0 * median_of(&measured[arm].iter().map(|a| a.busy).collect::<Vec<_>>())
            };
            let of_bare = ratios(&stream, &bare);
            let of_queue = ratios(&stream, &queue);
            let of_database = ratios(&stream, &database);
            let database_of_bare = ratios(&database, &bare);
            let inside_of_bare = ratios(&inside, &bare);
            let bound = median_of(&bounds);
            let client_bound = median_of(&client_bounds);
            let client = rates(CLIENT);
            self.row(
                &format!("streams, batch {batch}: relay to a stream ÷ bare"),
                format!("{of_bare:.2} x"),
                format!("rounds {}, target >= 0.75", each(&stream, &bare)),
            );
            self.row(
                &format!("streams, batch {batch}: relay to a stream ÷ to a queue"),
                format!("{of_queue:.2} x"),
                format!("rounds {}", each(&stream, &queue)),
            );
            if defaults {
                self.row(
                    "streams, at the defaults: relay to a stream ÷ bare",
                    format!("{:.2} x", ratios(&at_defaults, &bare)),
                    format!(
                        "rounds {}, target >= 0.75 (bare: batch {batch} in flight)",
                        each(&at_defaults, &bare)
                    ),
                );
                self.row(
                    "streams, at the defaults: relay to a stream ÷ to a queue",
                    format!("{:.2} x", ratios(&at_defaults, &queue)),
                    format!(
                        "rounds {}, target >= 3; to a stream ÷ to a stream at batch {batch} {:.2} x",
                        each(&at_defaults, &queue),
                        ratios(&at_defaults, &stream)
                    ),
                );
            }
            let started = |arm: usize| {
                measured[arm]
                    .iter()
                    .map(|a| a.with_start.unwrap_or(a.rate))
                    .collect::<Vec<_>>()
            };
            let (stream_started, queue_started) = (started(STREAM), started(QUEUE));
            self.row(
                &format!(
                    "streams, batch {batch}: with the worker's start, relay to a stream ÷ bare"
                ),
                format!("{:.2} x", ratios(&stream_started, &bare)),
                format!("rounds {}", each(&stream_started, &bare)),
            );
            self.row(
                &format!(
                    "streams, batch {batch}: with the worker's start, relay to a stream ÷ to a queue"
                ),
                format!("{:.2} x", ratios(&stream_started, &queue_started)),
                format!("rounds {}", each(&stream_started, &queue_started)),
            );
            self.row(
                &format!("streams, batch {batch}: claim and record alone ÷ bare"),
                format!("{database_of_bare:.2} x"),
                format!("rounds {}", each(&database, &bare)),
            );
            self.row(
                &format!("streams, batch {batch}: relay to a stream ÷ claim and record alone"),
                format!("{of_database:.2} x"),
                format!("rounds {}", each(&stream, &database)),
            );
            self.row(
                &format!(
                    "streams, batch {batch}: rows deleted on publish, relay to a stream ÷ bare"
                ),
                format!("{:.2} x", ratios(&deleting, &bare)),
                format!("rounds {}", each(&deleting, &bare)),
            );
            self.row(
                &format!("streams, batch {batch}: the database alone, inside PostgreSQL ÷ bare"),
                format!("{inside_of_bare:.2} x"),
                format!("rounds {}", each(&inside, &bare)),
            );
            self.row(
                &format!("streams, batch {batch}: the cheapest client ÷ bare"),
                format!("{:.2} x", ratios(&client, &bare)),
                format!("rounds {}", each(&client, &bare)),
            );
            self.row(
                &format!("streams, batch {batch}: cores busy"),
                format!("bare {:.0} %", busy(BARE)),
                format!(
                    "relay to a stream {:.0} %, to a queue {:.0} %, claim and record alone {:.0} %, inside PostgreSQL {:.0} %, the cheapest client {:.0} %",
                    busy(STREAM),
                    busy(QUEUE),
                    busy(CLAIM_AND_RECORD),
                    busy(INSIDE),
                    busy(CLIENT)
                ),
            );
            self.row(
                &format!("streams, batch {batch}: most any relay could reach ÷ bare"),
                format!("{bound:.2} x"),
                format!(
                    "rounds {}; relay to a stream {:.2} x of it",
                    joined(&bounds),
                    of_bare / bound
                ),
            );
            self.row(
                &format!(
                    "streams, batch {batch}: most a relay reading its rows over a connection could reach ÷ bare"
                ),
                format!("{client_bound:.2} x"),
                format!(
                    "rounds {}, highest {:.2}; relay to a stream {:.2} x of it",
                    joined(&client_bounds),
                    client_bounds.iter().copied().fold(f64::NAN, f64::max),
                    of_bare / client_bound
                ),
            );
            if !stream_baseline.is_empty() {
                self.row(
                    &format!("streams, batch {batch}: relay to a stream ÷ the baseline build's"),
                    format!("{:.2} x", ratios(&stream, &stream_baseline)),
                    format!("rounds {}", each(&stream, &stream_baseline)),
                );
            }
            let busy_of = |arm: usize| measured[arm].iter().map(|a| a.busy).collect::<Vec<_>>();
            out.insert(
                format!("batch_{batch}"),
                json!({
                    "bare_stream": bare, "relay_stream": stream, "relay_queue": queue,
                    "claim_and_record": database, "relay_stream_deleting": deleting,
                    "inside_the_database": inside, "cheapest_client": client,
                    "stream_of_bare": of_bare, "stream_of_queue": of_queue,
                    "stream_of_claim_and_record": of_database,
                    "claim_and_record_of_bare": database_of_bare,
                    "inside_the_database_of_bare": inside_of_bare,
                    "bound_of_bare": bounds,
                    "client_bound_of_bare": client_bounds,
                    "busy": {
                        "bare_stream": busy_of(BARE), "relay_stream": busy_of(STREAM),
                        "relay_queue": busy_of(QUEUE), "claim_and_record": busy_of(CLAIM_AND_RECORD),
                        "relay_stream_deleting": busy_of(DELETING),
                        "inside_the_database": busy_of(INSIDE),
                        "cheapest_client": busy_of(CLIENT),
                        "relay_stream_at_the_defaults": busy_of(DEFAULTS),
                    },
                    "relay_stream_baseline": stream_baseline,
                    "relay_stream_at_the_defaults": at_defaults,
                    "with_the_start": {
                        "relay_stream": stream_started, "relay_queue": queue_started,
                        "relay_stream_deleting": started(DELETING),
                    },
                }),
            );
        }
        let (to_stream, to_queue) = self.stream_trickles(&url).await;
        let p = |v: &[Duration], q| ms(pct(v, q));
        self.row(
            "streams, trickle 50 msg/s: insert to delivery p50",
            format!("{:.1} ms", p(&to_stream, 0.5)),
            format!("queue {:.1} ms", p(&to_queue, 0.5)),
        );
        self.row(
            "streams, trickle 50 msg/s: insert to delivery p99",
            format!("{:.1} ms", p(&to_stream, 0.99)),
            format!(
                "queue {:.1} ms ({:.2} x), target <= 1.5 x",
                p(&to_queue, 0.99),
                p(&to_stream, 0.99) / p(&to_queue, 0.99)
            ),
        );
        out.insert(
            "trickle".into(),
            json!({
                "stream_p50_ms": p(&to_stream, 0.5), "stream_p99_ms": p(&to_stream, 0.99),
                "queue_p50_ms": p(&to_queue, 0.5), "queue_p99_ms": p(&to_queue, 0.99),
            }),
        );
        let stored = if self.quick { 200_000 } else { 1_000_000 };
        let Lookups {
            first,
            one,
            all,
            reads,
            below,
        } = self.lookup_cost(&url, stored).await;
        let rate = stored as f64 / one.as_secs_f64();
        self.row(
            "streams, a takeover's look-up: one bucket",
            format!("{:.2} s", one.as_secs_f64()),
            format!(
                "{stored} messages stored since the rows' creation, {rate:.0} msg/s read; the stream's first read {:.2} s",
                first.as_secs_f64()
            ),
        );
        self.row(
            "streams, a takeover's look-up: 16 buckets at once",
            format!("{:.2} s", all.as_secs_f64()),
            format!(
                "{:.1} x one bucket's, {reads} read(s)",
                all.as_secs_f64() / one.as_secs_f64()
            ),
        );
        self.row(
            "streams, a takeover's look-up: a row below every stored id",
            format!("{:.2} s", below.as_secs_f64()),
            format!(
                "{:.2} x one bucket's (read again from further back, up to where the first read started)",
                below.as_secs_f64() / one.as_secs_f64()
            ),
        );
        out.insert(
            "lookup".into(),
            json!({
                "messages": stored, "first_read_s": first.as_secs_f64(),
                "one_bucket_s": one.as_secs_f64(), "all_buckets_s": all.as_secs_f64(),
                "all_buckets_reads": reads, "below_every_id_s": below.as_secs_f64(),
            }),
        );
        self.results.insert("streams".into(), Value::Object(out));
    }

    /// The ceiling: `n` messages through 16 named producers, one per
    /// bucket, each with one batch of `batch` in flight.
    async fn bare_stream(&self, url: &str, n: usize, batch: u32) -> Arm {
        let client = std::sync::Arc::new(connect(url).await);
        let stream = fresh_stream(&client).await;
        let per_bucket = stream_messages(&stream, n);
        let timing = Timing::start();
        publish_all(&client, &stream, per_bucket, batch).await;
        let arm = timing.arm(n as f64 / timing.start.elapsed().as_secs_f64());
        let _ = client.delete_stream(&stream).await;
        arm
    }

    /// A takeover's look-up on a busy stream, as the relay's stream sink
    /// makes it (`outboxd::stream::gather`): `n` messages of the 16
    /// buckets stored after the rows in question were created, then the
    /// look-up of one id the stream does not hold (a row that committed
    /// late), which reads to the stream's end — for one bucket, then for
    /// all 16 at once on one connection, as after the kill of a worker that
    /// held them.
    async fn lookup_cost(&self, url: &str, n: usize) -> Lookups {
        let client = std::sync::Arc::new(connect(url).await);
        let stream = fresh_stream(&client).await;
        let per_bucket = stream_messages(&stream, n);
        let labels = Partitioner::new(BUCKETS).labels();
        let created = chrono::Utc::now();
        publish_all(&client, &stream, per_bucket, 1_000).await;
        let look_up = |gather: std::sync::Arc<Gather>, bucket: String, id: u64| {
            let (client, stream) = (client.clone(), stream.clone());
            async move {
                let never_sent = HashSet::from([id]);
                let found = gather
                    .stored_among(client, &stream, &bucket, never_sent, created, WAIT)
                    .await
                    .unwrap();
                assert!(found.is_empty(), "the look-up found a row never sent");
            }
        };
        let alone = |bucket: &str, id: u64| {
            let read = look_up(std::sync::Arc::default(), bucket.to_string(), id);
            async move {
                let start = Instant::now();
                read.await;
                start.elapsed()
            }
        };
        // The broker serves the first read of these segments slower than
        // the next (1.4–1.6 s against 0.9 s for 200,000 messages): it is
        // timed apart.
        let above = n as u64 + 1;
        let first = alone(&labels[0], above).await;
        let one = alone(&labels[1], above).await;
        let gather = std::sync::Arc::new(Gather::default());
        let start = Instant::now();
        let all = labels
            .iter()
            .map(|b| look_up(gather.clone(), b.clone(), above));
        futures_util::future::join_all(all).await;
        let all = start.elapsed();
        let below = alone(&labels[2], 0).await;
        let _ = client.delete_stream(&stream).await;
        Lookups {
            first,
            one,
            all,
            reads: gather.reads(),
            below,
        }
    }

    /// A fresh PostgreSQL database holding `n` pending rows that no worker
    /// will publish, and its URL.
    async fn seeded_nowhere(&self, n: usize) -> (Store, String) {
        let (store, _, url) = self
            .fresh_on(Backend::Postgres, "outboxd_bench_streams", "")
            .await;
        self.seed(&store, n, "bench-streams-nowhere", false).await;
        (store, url)
    }

    /// The database's part alone: `n` seeded rows claimed and recorded
    /// published by the relay's statements, every bucket at once, with
    /// nothing sent anywhere.
    async fn claim_and_record(&self, n: usize, batch: u32) -> Arm {
        let (store, _) = self.seeded_nowhere(n).await;
        let labels = Partitioner::new(BUCKETS).labels();
        // The claim TTL and the renewal margin a worker derives from the
        // default configuration.
        let settings = RelaySettings::from_config(&Config::default());
        let (claim_ttl, min_left) = (settings.claim_ttl, settings.claim_min_left);
        let timing = Timing::start();
        let drains = labels.iter().map(|bucket| {
            let store = store.clone();
            async move {
                let holder = Holder {
                    partition_key: bucket,
                    token: ClaimToken::new(),
                    fence: None,
                    published: Published::Kept,
                };
                // Taken by the first claim, held after, as a drainer holds
                // it (a claim that finds it not held takes it again).
                let mut held = false;
                loop {
                    let claim = Claim {
                        holder,
                        limit: batch,
                        claim_ttl,
                        min_left,
                        in_flight: &[],
                        held,
                    };
                    let rows = store.claim(claim).await.unwrap();
                    if rows.is_empty() {
                        break;
                    }
                    held = true;
                    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
                    let recorded = store.record_published(holder, &ids).await.unwrap();
                    assert_eq!(recorded as usize, ids.len());
                }
            }
        });
        futures_util::future::join_all(drains).await;
        let arm = timing.arm(drained_rate(&store, n, timing.start).await);
        store.close().await;
        arm
    }

    /// The floor under any relay that records each row, however it is
    /// written: a procedure inside PostgreSQL that reads each bucket's
    /// rows from the pending index in `id` order, `batch` at a time, and
    /// deletes them (the cheapest record G1 allows), committing each batch,
    /// 16 buckets at once on 16 connections. No client, no network, no
    /// claim, no lease: what the database alone spends on a row.
    async fn inside_the_database(&self, n: usize, batch: u32) -> Arm {
        let (store, url) = self.seeded_nowhere(n).await;
        let labels = Partitioner::new(BUCKETS).labels();
        let mut sessions = session_per_bucket(&url, labels.len()).await;
        sqlx::raw_sql(DRAIN_INSIDE)
            .execute(&mut sessions[0])
            .await
            .unwrap();
        let timing = Timing::start();
        // The simple query protocol: a procedure that commits may not run
        // inside the extended protocol's implicit transaction.
        let drains = labels.iter().zip(&mut sessions).map(|(bucket, session)| {
            let call = format!("CALL outboxd_bench_drain('{bucket}', {batch})");
            async move {
                sqlx::raw_sql(sqlx::AssertSqlSafe(call))
                    .execute(session)
                    .await
                    .unwrap();
            }
        });
        futures_util::future::join_all(drains).await;
        drained_arm(store, sessions, &timing, n).await
    }

    /// The floor under any relay that reads its rows out of the database
    /// and records each: one statement a batch that reads a bucket's next
    /// `batch` rows from the pending index in `id` order, deletes them and
    /// returns what a message is built from, decoded here, 16 buckets at
    /// once on 16 connections. No claim, no lease, no broker: what the
    /// database and a client at its other end spend on a row, however the
    /// relay is written.
    async fn cheapest_client(&self, n: usize, batch: u32) -> Arm {
        let (store, url) = self.seeded_nowhere(n).await;
        let labels = Partitioner::new(BUCKETS).labels();
        let mut sessions = session_per_bucket(&url, labels.len()).await;
        let timing = Timing::start();
        let drains = labels
            .iter()
            .zip(&mut sessions)
            .map(|(bucket, session)| async move {
                loop {
                    let rows: Vec<TakenRow> = sqlx::query_as(TAKE_AND_DELETE)
                        .bind(bucket)
                        .bind(i64::from(batch))
                        .fetch_all(&mut *session)
                        .await
                        .unwrap();
                    if rows.is_empty() {
                        break;
                    }
                }
            });
        futures_util::future::join_all(drains).await;
        drained_arm(store, sessions, &timing, n).await
    }

    /// One worker of `bin` draining `n` seeded rows into a fresh stream
    /// (`Some` stream port) or a queue (`None`), keeping the rows it
    /// publishes ([`KEPT`]) or deleting them ([`DELETED`]).
    async fn relay_to(
        &self,
        bin: &std::path::Path,
        stream_url: Option<&str>,
        n: usize,
        claims: Claims,
        keep_published: bool,
    ) -> Arm {
        let client = match stream_url {
            Some(url) => Some(connect(url).await),
            None => None,
        };
        let to = match &client {
            Some(client) => fresh_stream(client).await,
            None => {
                let queue = "bench-streams-queue".to_string();
                self.declare_purged(&queue).await;
                queue
            }
        };
        let toml = format!(
            "\n[outbox]\n{}keep_published = {keep_published}\n",
            claims.toml()
        );
        let (store, config, _) = self
            .fresh_on(Backend::Postgres, "outboxd_bench_streams", &toml)
            .await;
        self.seed(&store, n, &to, false).await;
        let vars = match stream_url {
            Some(url) => vec![
                ("OUTBOXD_AMQP__STREAM_URL", url.to_string()),
                ("OUTBOXD_AMQP__STREAMS", to.clone()),
            ],
            None => Vec::new(),
        };
        // The clock starts at the worker's first record, as the bare
        // publisher's starts once it is connected: the worker's start (its
        // connections, leases, producers and their look-ups) is paid once,
        // not per message. The rate with it is kept beside.
        let heads = head_ids(&store).await;
        let spawned = Instant::now();
        let mut worker = spawn_bin(bin, &config, &["--silent"], &vars);
        while head_ids(&store).await == heads {
            assert!(spawned.elapsed() < WAIT, "the worker recorded nothing");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let timing = Timing::start();
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM outbox WHERE published_at IS NULL AND failed_at IS NULL",
        )
        .fetch_one(pg(&store))
        .await
        .unwrap();
        assert!(
            left > 0,
            "the worker drained every row before its first record was seen: too few rows to time"
        );
        let mut arm = timing.arm(drained_rate(&store, left as usize, timing.start).await);
        arm.with_start = Some(n as f64 / spawned.elapsed().as_secs_f64());
        super::terminate(&mut worker);
        store.close().await;
        if let Some(client) = client {
            let _ = client.delete_stream(&to).await;
        }
        arm
    }

    /// The trickle to a stream and to a queue, in alternating rounds (a
    /// noisy minute of the machine falls on both): insert-to-delivery
    /// times, each sorted.
    async fn stream_trickles(&self, url: &str) -> (Vec<Duration>, Vec<Duration>) {
        let count = if self.quick { 200 } else { 1_000 };
        let (mut to_stream, mut to_queue) = (Vec::new(), Vec::new());
        for round in 0..TRICKLE_ROUNDS {
            let order = if round % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for stream in order {
                let got = self.trickle(url, stream, count / TRICKLE_ROUNDS).await;
                if stream {
                    &mut to_stream
                } else {
                    &mut to_queue
                }
                .extend(got);
            }
        }
        for (name, times) in [("stream", &mut to_stream), ("queue", &mut to_queue)] {
            times.sort();
            println!(
                "  trickle to a {name}: p50 {:.1} ms, p99 {:.1} ms",
                ms(pct(times, 0.5)),
                ms(pct(times, 0.99))
            );
        }
        (to_stream, to_queue)
    }

    /// One worker on a fresh database; `count` messages trickled at 50 a
    /// second to a fresh stream or to a queue.
    async fn trickle(&self, url: &str, to_stream: bool, count: usize) -> Vec<Duration> {
        let kind = if to_stream { "stream" } else { "queue" };
        let client = connect(url).await;
        let to = if to_stream {
            fresh_stream(&client).await
        } else {
            let queue = "bench-streams-trickle".to_string();
            self.declare_purged(&queue).await;
            queue
        };
        let (store, config, db_url) = self
            .fresh_on(Backend::Postgres, "outboxd_bench_streams_trickle", "")
            .await;
        let vars = if to_stream {
            vec![
                ("OUTBOXD_AMQP__STREAM_URL", url.to_string()),
                ("OUTBOXD_AMQP__STREAMS", to.clone()),
            ]
        } else {
            Vec::new()
        };
        let mut worker = spawn_bin(
            std::path::Path::new(super::BIN),
            &config,
            &["--silent"],
            &vars,
        );
        // The worker's leases first.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let sent = TRICKLE_WARM_UP + count;
        let deliveries = if to_stream {
            tokio::spawn(read_stream_times(client, to.clone(), sent))
        } else {
            tokio::spawn(read_queue_times(self.amqp_url.clone(), to.clone(), sent))
        };
        produce_trickle(&db_url, &to, sent, 50).await;
        let mut got = tokio::time::timeout(Duration::from_secs(120), deliveries)
            .await
            .expect("every trickled message delivered")
            .unwrap();
        got.sort();
        got.drain(..TRICKLE_WARM_UP);
        super::terminate(&mut worker);
        store.close().await;
        if to_stream {
            let client = connect(url).await;
            let _ = client.delete_stream(&to).await;
        }
        if let Ok(dir) = std::env::var("OUTBOXD_BENCH_TRICKLE_DUMP") {
            dump(std::path::Path::new(&dir), kind, &got);
        }
        got.into_iter().map(|(_, took)| took).collect()
    }
}

/// `count` sessions to `url`, every one connected before an arm's clock
/// starts.
async fn session_per_bucket(url: &str, count: usize) -> Vec<PgConnection> {
    let mut sessions = Vec::with_capacity(count);
    for _ in 0..count {
        sessions.push(PgConnection::connect(url).await.unwrap());
    }
    sessions
}

/// The arm of a drain through `sessions` once `store` holds none of its
/// `n` rows pending; closes both.
async fn drained_arm(store: Store, sessions: Vec<PgConnection>, timing: &Timing, n: usize) -> Arm {
    let arm = timing.arm(drained_rate(&store, n, timing.start).await);
    for session in sessions {
        let _ = session.close().await;
    }
    store.close().await;
    arm
}

fn limits() -> PublishLimits {
    PublishLimits {
        max_payload_bytes: u64::MAX,
        stop_sending_at: None,
        // A fresh database's leases are all at epoch 1.
        lease_epoch: Some(1),
        trust: None,
        lease_was_free: true,
    }
}

async fn connect(url: &str) -> StreamClient {
    StreamClient::connect(&StreamUrl::parse(url).unwrap(), WAIT)
        .await
        .unwrap()
}

/// A new stream (its producers start from nothing).
async fn fresh_stream(client: &StreamClient) -> String {
    let name = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let retention = HashMap::from([("max-length-bytes".to_string(), "2000000000".to_string())]);
    client.create_stream(&name, retention).await.unwrap();
    name
}

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Commits `count` messages to `to`, one per transaction, `rate` a second;
/// each payload is the time just before its `INSERT`.
async fn produce_trickle(db_url: &str, to: &str, count: usize, rate: u64) {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(db_url)
        .await
        .unwrap();
    let producer = Producer::default();
    let mut next = tokio::time::Instant::now();
    for i in 0..count {
        next += Duration::from_micros(1_000_000 / rate);
        tokio::time::sleep_until(next).await;
        let payload = now_nanos().to_string();
        let message = Message::new(format!("key-{}", i % 200), "", to, payload);
        let mut tx = pool.begin().await.unwrap();
        producer.enqueue(&mut *tx, message).await.unwrap();
        tx.commit().await.unwrap();
    }
}

/// Reads `count` messages from the stream's end; each one's time since
/// its payload's.
async fn read_stream_times(client: StreamClient, stream: String, count: usize) -> Vec<Trickled> {
    let mut reader = client
        .subscribe(&stream, OffsetSpecification::Next, 10)
        .await
        .unwrap();
    let mut times = Vec::new();
    while times.len() < count {
        let chunk = reader.chunks.recv().await.expect("the stream connection");
        let now = now_nanos();
        for m in chunk {
            times.push(trickled(m.data().unwrap_or_default(), now));
        }
        client.credit(reader.id, 1).await.unwrap();
    }
    times
}

/// Consumes `count` messages from `queue`; each one's time since its
/// payload's.
async fn read_queue_times(amqp_url: String, queue: String, count: usize) -> Vec<Trickled> {
    let conn = Connection::connect(&amqp_url, ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let mut consumer = ch
        .basic_consume(
            queue.as_str().into(),
            "bench".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut times = Vec::new();
    while times.len() < count {
        let delivery = consumer.next().await.unwrap().unwrap();
        times.push(trickled(&delivery.data, now_nanos()));
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    times
}

/// A trickled message: when its `INSERT` began (Unix ns, its payload) and
/// how long after that it was delivered.
type Trickled = (u128, Duration);

fn trickled(payload: &[u8], now: u128) -> Trickled {
    let then: u128 = std::str::from_utf8(payload).unwrap().parse().unwrap();
    (then, Duration::from_nanos(now.saturating_sub(then) as u64))
}

/// With `OUTBOXD_BENCH_TRICKLE_DUMP=<dir>`, a round's counted messages
/// (`times`, in the order they were produced), one line each:
/// milliseconds from the first `INSERT` to its own, and its `INSERT` →
/// delivery; headed by the Unix time of the first `INSERT`. One file per
/// round and destination, `stream-trickle-<stream|queue>-<Unix ms>.txt`.
fn dump(dir: &std::path::Path, kind: &str, times: &[Trickled]) {
    let Some(&(first, _)) = times.first() else {
        return;
    };
    let mut text = format!("# first INSERT at {:.3} (Unix s)\n", first as f64 / 1e9);
    for (then, took) in times {
        text += &format!("{:.3} {:.3}\n", (then - first) as f64 / 1e6, ms(*took));
    }
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(format!("stream-trickle-{kind}-{}.txt", first / 1_000_000));
    std::fs::write(path, text).unwrap();
}

/// What [`Bench::lookup_cost`] measured.
struct Lookups {
    /// The first read of the stream, one bucket's.
    first: Duration,
    /// One bucket's, the stream read before.
    one: Duration,
    /// 16 buckets' at once, and the reads they took.
    all: Duration,
    reads: u64,
    /// One bucket's, for a row below every id the stream holds (a row
    /// that committed late and was never sent): the read from the margin
    /// looks as if it started too late, and the stream is read from
    /// further back, up to where that read started.
    below: Duration,
}

/// Each bucket's head (its lowest pending id), in bucket order.
async fn head_ids(store: &Store) -> Vec<Option<i64>> {
    let labels = Partitioner::new(BUCKETS).labels();
    let heads = store.bucket_heads(&labels).await.unwrap();
    heads.iter().map(|head| head.id).collect()
}

/// `n` messages for `stream`, as the relay builds them, with publishing ids
/// 1..=n, grouped by bucket.
fn stream_messages(
    stream: &str,
    n: usize,
) -> HashMap<String, Vec<(u64, outboxd::stream::Message)>> {
    let partitioner = Partitioner::new(BUCKETS);
    let limits = limits();
    let mut per_bucket: HashMap<String, Vec<(u64, outboxd::stream::Message)>> = HashMap::new();
    for i in 0..n {
        let row = claimed_row(&partitioner, i, KEYS, stream, vec![b'x'; PAYLOAD]);
        let message = stream_message(&row, &limits).unwrap();
        per_bucket
            .entry(row.partition_key)
            .or_default()
            .push((row.id as u64, message));
    }
    per_bucket
}

/// Publishes every bucket's messages through its own named producer, one
/// batch of `batch` in flight each, all buckets at once.
async fn publish_all(
    client: &std::sync::Arc<StreamClient>,
    stream: &str,
    per_bucket: HashMap<String, Vec<(u64, outboxd::stream::Message)>>,
    batch: u32,
) {
    let senders = per_bucket.into_iter().map(|(bucket, messages)| {
        let (client, stream) = (client.clone(), stream.to_string());
        async move {
            let name = format!("bench/{bucket}");
            let mut producer = client
                .declare_publisher(Some(&name), &stream)
                .await
                .unwrap();
            let mut messages = messages.into_iter().peekable();
            while messages.peek().is_some() {
                let chunk: Vec<_> = messages.by_ref().take(batch as usize).collect();
                let count = chunk.len();
                client.publish(producer.id, chunk).await.unwrap();
                let mut confirmed = 0;
                while confirmed < count {
                    match tokio::time::timeout(WAIT, producer.confirms.recv()).await {
                        Ok(Some(Confirm::Stored(ids))) => confirmed += ids.len(),
                        other => panic!("bare stream publisher: {other:?}"),
                    }
                }
            }
        }
    });
    futures_util::future::join_all(senders).await;
}
