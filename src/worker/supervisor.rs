//! The worker's background tasks: one place that starts them and one that
//! stops them (as mini-redis's `server::run`).
//!
//! Every task runs until the supervisor's token is cancelled, which
//! [`Supervisor::stop`] does once the worker has stopped draining; each
//! then has until one shared deadline to finish, after which it is
//! aborted. A task that ends with an error makes the worker exit with it
//! (the first such error is returned).

use std::future::Future;
use tracing::Instrument;

use futures_util::future::BoxFuture;
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::WorkError;

/// A running task: its name (for the log), how to abort it, its outcome.
struct Task {
    name: &'static str,
    abort: AbortHandle,
    outcome: BoxFuture<'static, Option<WorkError>>,
}

/// Owns the background tasks of one worker.
pub(super) struct Supervisor {
    token: CancellationToken,
    tasks: Vec<Task>,
}

impl Supervisor {
    pub(super) fn new() -> Self {
        Self {
            token: CancellationToken::new(),
            tasks: Vec::new(),
        }
    }

    /// The token every background task stops on.
    pub(super) fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Starts a task whose failure stops the worker.
    pub(super) fn spawn_fallible(
        &mut self,
        name: &'static str,
        task: impl Future<Output = Result<(), WorkError>> + Send + 'static,
    ) {
        let handle = tokio::spawn(task.in_current_span());
        self.adopt_with(name, handle, |r| r.err());
    }

    /// Starts a task that cannot fail.
    pub(super) fn spawn(
        &mut self,
        name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        self.adopt(name, tokio::spawn(task.in_current_span()));
    }

    /// Takes over a task started elsewhere (it must stop on [`Self::token`]).
    pub(super) fn adopt(&mut self, name: &'static str, handle: JoinHandle<()>) {
        self.adopt_with(name, handle, |()| None);
    }

    fn adopt_with<T: Send + 'static>(
        &mut self,
        name: &'static str,
        handle: JoinHandle<T>,
        fatal: fn(T) -> Option<WorkError>,
    ) {
        let abort = handle.abort_handle();
        let outcome = Box::pin(async move { handle.await.ok().and_then(fatal) });
        self.tasks.push(Task {
            name,
            abort,
            outcome,
        });
    }

    /// Stops every task: cancels the token, waits for each until
    /// `deadline`, aborts the ones still running. The first error a task
    /// ended with, if any.
    pub(super) async fn stop(self, deadline: Instant) -> Option<WorkError> {
        self.token.cancel();
        let mut first = None;
        for task in self.tasks {
            match tokio::time::timeout_at(deadline, task.outcome).await {
                Ok(error) => first = first.or(error),
                Err(_) => {
                    tracing::debug!(task = task.name, "did not stop in time; aborted");
                    task.abort.abort();
                }
            }
        }
        first
    }
}
