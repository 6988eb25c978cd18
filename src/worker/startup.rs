//! A worker's start-up, in order: connect to the database and refuse one
//! whose schema or bucket count does not match this binary and
//! configuration; bind the dashboard's and the probes' listeners (so a
//! taken port stops start-up before anything else is done); join the
//! membership; make a first attempt at the broker. Only the listeners and
//! the join can end start-up; a broker that is not reachable yet is
//! retried by the relay (a worker that never reached it takes no bucket).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use super::{WorkError, WorkOptions, announce};
use crate::amqp::Broker;
use crate::config::Config;
use crate::coordinator::fleet;
use crate::coordinator::{JoinError, Membership};
use crate::partitioner::Partitioner;
use crate::store::workers::WorkerMode;
use crate::store::{Store, StoreError, schema};

/// What start-up made, for the rest of the worker's life.
pub(super) struct Started {
    pub store: Store,
    pub partitioner: Partitioner,
    pub mode: WorkerMode,
    pub membership: Membership,
    pub broker: Arc<Broker>,
    /// `--ui`: the dashboard's listener.
    pub dashboard: Option<TcpListener>,
    /// `worker.health_listen`: the probes' listener.
    pub probes: Option<TcpListener>,
}

/// Starts a worker (see the module docs).
pub(super) async fn start(config: &Config, opts: &WorkOptions) -> Result<Started, WorkError> {
    let partitioner = Partitioner::new(config.outbox.partition_count);
    let store = Store::connect(
        &crate::store::StoreSettings::from_config(config),
        "outboxd work",
    )
    .await?;
    retry_lost_query(|| schema::check(&*store, partitioner)).await?;

    let dashboard = match opts.ui {
        true => Some(crate::dashboard::bind(config.dashboard.listen).await?),
        false => None,
    };
    let probes = match config.worker.health_listen {
        Some(addr) => Some(crate::dashboard::bind(addr).await?),
        None => None,
    };

    let mode = if opts.no_leasing {
        WorkerMode::NoLeasing
    } else {
        WorkerMode::Leasing
    };
    let membership = Membership::new(&config.worker.name, mode, config.worker.heartbeat_ttl);
    crate::logs::name_this_process(&membership.name);
    // Joining first: a refusal (another worker is live) is the only thing
    // said. Peers hand buckets over only once this worker's coordinator
    // says it can publish (coordinator::fleet).
    retry_lost_query(|| async {
        match membership.join(&store).await {
            Err(JoinError::Store(e)) => Err(e),
            other => Ok(other),
        }
    })
    .await??;
    let broker = Arc::new(Broker::new(
        &config.amqp,
        format!("outboxd {} {}", membership.name, membership.worker_id),
    ));
    if let Err(e) = broker.connect_once().await {
        if opts.once {
            membership.leave(&store).await;
            return Err(WorkError::Broker(e.to_string()));
        }
        tracing::warn!(error = %e, "RabbitMQ is not reachable yet; the relay keeps retrying");
    }
    if mode == WorkerMode::Leasing {
        announce(&store, fleet::announce::JOIN).await;
    }
    Ok(Started {
        store,
        partitioner,
        mode,
        membership,
        broker,
        dashboard,
        probes,
    })
}

/// Runs a start-up step again when a query of it was lost to a transient
/// error (its connection killed, the server restarting): a worker started
/// during such a moment comes up rather than exiting. A database that
/// cannot be reached at all still ends start-up at once, with the reason.
async fn retry_lost_query<T, F, Fut>(mut step: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    const ATTEMPTS: u32 = 3;
    let mut attempt = 1;
    loop {
        match step().await {
            Err(e @ StoreError::Query { .. }) if e.is_transient() && attempt < ATTEMPTS => {
                tracing::warn!(error = %e, "start-up query failed; trying again");
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}
