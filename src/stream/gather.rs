//! Takeover look-ups of one stream, gathered into shared reads.
//!
//! A worker that takes over the leases of a worker that died asks, for
//! each bucket, which of the rows the dead worker may have sent the stream
//! holds ([`super::lookup`]). Each question reads the stream from shortly
//! before those rows were created to its end; on a busy stream that is
//! every message stored meanwhile, whichever bucket it belongs to — and
//! the buckets taken over at once ask at once. One read answers all of
//! them: the questions asked about a stream within a short quiet window
//! ([`QUIET`], at most [`GATHER_AT_MOST`]) share one read from the oldest
//! of their rows, and those asked while it runs share the next.
//!
//! Sharing keeps each question's promise: the read starts no later than
//! [`super::lookup::LOOKUP_MARGIN`] before the oldest row of every
//! question it answers, and its end is taken after every one of them was
//! asked — after the lease it is asked for was taken, so after its earlier
//! owner stopped sending.
//!
//! A question about rows created long ago (a backlog) lengthens the read
//! for every question it shares; asked apart, each would have read as
//! much, at the same time, over the same connection.
//!
//! A read runs in a task of its own: a drainer stopped while it waits
//! leaves the read to the others.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::client::StreamClient;
use super::lookup::{self, LookupError, Rows};

/// A read starts once no question about its stream has come for this
/// long…
pub const QUIET: Duration = Duration::from_millis(50);

/// …or this long after the first question, whichever comes first.
pub const GATHER_AT_MOST: Duration = Duration::from_secs(1);

/// The questions waiting for a read, per stream, and how many reads ran.
#[derive(Default)]
pub struct Gather {
    streams: Mutex<HashMap<String, Waiting>>,
    reads: AtomicU64,
}

/// One stream's questions.
#[derive(Default)]
struct Waiting {
    questions: Vec<Question>,
    /// A task reads (or gathers) for this stream.
    reading: bool,
}

struct Question {
    bucket: String,
    wanted: HashSet<u64>,
    oldest: DateTime<Utc>,
    answer: oneshot::Sender<Result<HashSet<u64>, LookupError>>,
}

impl Gather {
    /// The ids among `wanted`, rows of `bucket` the oldest of which was
    /// created at `oldest`, that `stream` holds, read through `client`
    /// (each chunk awaited at most `wait`) together with the other
    /// questions about `stream` asked about the same time.
    pub async fn stored_among(
        self: &Arc<Self>,
        client: Arc<StreamClient>,
        stream: &str,
        bucket: &str,
        wanted: HashSet<u64>,
        oldest: DateTime<Utc>,
        wait: Duration,
    ) -> Result<HashSet<u64>, LookupError> {
        let (answer, answered) = oneshot::channel();
        let question = Question {
            bucket: bucket.to_string(),
            wanted,
            oldest,
            answer,
        };
        let start = {
            let mut streams = self.streams.lock().expect("not poisoned");
            let waiting = streams.entry(stream.to_string()).or_default();
            waiting.questions.push(question);
            !std::mem::replace(&mut waiting.reading, true)
        };
        if start {
            tokio::spawn(
                self.clone()
                    .read_while_asked(client, stream.to_string(), wait),
            );
        }
        answered.await.unwrap_or(Err(LookupError::Closed))
    }

    /// How many reads ran (each answering one or more questions).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    fn asked(&self, stream: &str) -> usize {
        let streams = self.streams.lock().expect("not poisoned");
        streams.get(stream).map_or(0, |w| w.questions.len())
    }

    /// Gathers the questions about `stream`, then reads for them, and
    /// again while more were asked during a read.
    async fn read_while_asked(
        self: Arc<Self>,
        client: Arc<StreamClient>,
        stream: String,
        wait: Duration,
    ) {
        let until = Instant::now() + GATHER_AT_MOST;
        let mut asked = self.asked(&stream);
        loop {
            tokio::time::sleep(QUIET).await;
            let now = self.asked(&stream);
            if now == asked || Instant::now() >= until {
                break;
            }
            asked = now;
        }
        loop {
            let questions = {
                let mut streams = self.streams.lock().expect("not poisoned");
                let waiting = streams.get_mut(&stream).expect("kept while reading");
                if waiting.questions.is_empty() {
                    streams.remove(&stream);
                    return;
                }
                std::mem::take(&mut waiting.questions)
            };
            let mut wanted = Rows::new();
            for q in &questions {
                wanted
                    .entry(q.bucket.clone())
                    .or_default()
                    .extend(q.wanted.iter().copied());
            }
            let oldest = questions.iter().map(|q| q.oldest).min().expect("not empty");
            self.reads.fetch_add(1, Ordering::Relaxed);
            let read = lookup::stored_among(&client, &stream, &wanted, oldest, wait).await;
            for q in questions {
                let answer = match &read {
                    Ok(found) => Ok(found.get(&q.bucket).map_or_else(HashSet::new, |ids| {
                        ids.intersection(&q.wanted).copied().collect()
                    })),
                    Err(e) => Err(e.clone()),
                };
                let _ = q.answer.send(answer);
            }
        }
    }
}
