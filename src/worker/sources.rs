//! `outboxd work` with `[[source]]` entries: one worker per source in this
//! process, each joined to its source's fleet on its own — its row,
//! targets, leases, claims and wake-ups in that source's database, its own
//! connection pool (`database.max_connections` each) and broker
//! connection — so sources share no bucket space and no connection.
//!
//! Isolation: a source that cannot start (database or broker unreachable,
//! wrong password, schema not migrated) or that stops with an error is
//! reported in one line naming it and tried again with a growing pause (1 s
//! doubling to 1 min), while the others run on untouched. Every log line
//! of a source's worker carries its name (a `source` span).
//!
//! Not yet for several sources: the dashboard (`--ui`; `outboxd ui
//! --source NAME` serves one) and `worker.health_listen`.

use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{WorkError, WorkOptions};
use crate::config::sources::Source;
use crate::config::{Config, ConfigError};

/// The first pause before a failed source is tried again; it doubles up to
/// [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// Serves every source of `config` until `cancel` fires (with `--once`,
/// until each has drained what was ready).
pub async fn run(
    config: &Config,
    opts: &WorkOptions,
    cancel: CancellationToken,
) -> Result<(), WorkError> {
    let not_yet = |what: &str| {
        Err(WorkError::Config(ConfigError::Env(format!(
            "{what} is not served for several sources yet: serve one source's dashboard with `outboxd ui --source NAME`"
        ))))
    };
    if opts.ui {
        return not_yet("the dashboard (--ui)");
    }
    if config.worker.health_listen.is_some() {
        return not_yet("worker.health_listen");
    }
    let sources = config.sources()?;
    tracing::info!(
        sources = %sources.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(","),
        "serving {} sources", sources.len()
    );
    let mut served = JoinSet::new();
    for source in sources {
        served.spawn(serve(source, opts.clone(), cancel.clone()));
    }
    let mut failed = None;
    while let Some(done) = served.join_next().await {
        if let Ok(Err(e)) = done {
            failed.get_or_insert(e);
        }
    }
    failed.map_or(Ok(()), Err)
}

/// One source's worker, started again after an error until `cancel`
/// fires; with `--once` its first result is final.
async fn serve(
    source: Source,
    mut opts: WorkOptions,
    cancel: CancellationToken,
) -> Result<(), WorkError> {
    // At ERROR level, so it is on whenever any line is (`--silent` included).
    let span = tracing::error_span!("source", source = %source.name);
    opts.source = Some(source.name.clone());
    let mut pause = RETRY_FIRST;
    loop {
        let ran = super::run(&source.config, &opts, cancel.clone())
            .instrument(span.clone())
            .await;
        let error = match ran {
            Ok(_) => return Ok(()),
            Err(e) if opts.once => return Err(e),
            Err(e) => e,
        };
        if cancel.is_cancelled() {
            return Ok(());
        }
        span.in_scope(|| {
            tracing::error!(
                retry_in = ?pause,
                "source {} is not served: {error}; the other sources are not affected",
                source.name
            )
        });
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(RETRY_MAX);
    }
}
