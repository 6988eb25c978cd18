//! The worker's report lines on stdout, written by a thread of their own.
//!
//! A reader of stdout that stalls (a pipe nobody drains, a log shipper
//! that hangs) blocks a write. Written from the async tasks, that would
//! stop the report loop (and with it the liveness probe) and, at the last
//! line, the exit itself, beyond any shutdown bound. Here a stalled stdout
//! costs only lines: the writer thread holds up to [`BACKLOG`] of them;
//! beyond that they are dropped, with one warning. One thread serves every
//! source of the process, so lines never interleave.

use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};

use tokio::sync::oneshot;

/// Lines waiting for the writer thread before new ones are dropped.
const BACKLOG: usize = 64;

enum Message {
    Text(String),
    /// Answered once every text before it has been written.
    Flush(oneshot::Sender<()>),
}

static WRITER: OnceLock<Option<SyncSender<Message>>> = OnceLock::new();
static WARNED: AtomicBool = AtomicBool::new(false);

/// The writer thread's queue, started on first use (`None` if the thread
/// could not start: lines are then dropped).
fn writer() -> Option<&'static SyncSender<Message>> {
    WRITER
        .get_or_init(|| {
            let (tx, rx) = sync_channel::<Message>(BACKLOG);
            let thread = std::thread::Builder::new()
                .name("outboxd-stdout".into())
                .spawn(move || {
                    let stdout = std::io::stdout();
                    for message in rx {
                        match message {
                            Message::Text(text) => {
                                let mut out = stdout.lock();
                                let _ = out.write_all(text.as_bytes());
                                let _ = out.flush();
                            }
                            Message::Flush(done) => {
                                let _ = done.send(());
                            }
                        }
                    }
                });
            thread.ok().map(|_| tx)
        })
        .as_ref()
}

/// Queues `text` (written as is: a line ends with its own `\n`). Never
/// blocks.
pub(super) fn print(text: String) {
    let Some(tx) = writer() else { return };
    let full = matches!(tx.try_send(Message::Text(text)), Err(TrySendError::Full(_)));
    if full && !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!("stdout is not being read: report lines are dropped until it is");
    }
}

/// Waits until every line queued so far is written, up to `deadline`.
pub(super) async fn flush(deadline: tokio::time::Instant) {
    // Nothing was ever printed (`--silent`): no thread to start.
    let Some(Some(tx)) = WRITER.get() else {
        return;
    };
    let (done, written) = oneshot::channel();
    let mut flush = Message::Flush(done);
    // Waits for room behind the lines queued, then for them to be written.
    let queued = async {
        loop {
            match tx.try_send(flush) {
                Ok(()) => return true,
                Err(TrySendError::Full(back)) => flush = back,
                Err(TrySendError::Disconnected(_)) => return false,
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    let _ = tokio::time::timeout_at(deadline, async {
        if queued.await {
            let _ = written.await;
        }
    })
    .await;
}
