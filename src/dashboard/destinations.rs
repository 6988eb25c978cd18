//! The fleet's destinations: what the live workers' heartbeats say they
//! delivered to each queue, exchange and stream
//! ([`crate::sink::destinations`]), added up — the page's *Destinations*
//! table, `outboxd status`'s lines and `outboxd_destination_rate`.

use serde::Serialize;

use crate::sink::destinations::{self, Kind};
use crate::store::workers::WorkerView;

/// One destination as the dashboard shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DestinationView {
    /// The sink that delivers to it: `amqp` or `stream`.
    pub sink: &'static str,
    pub kind: Kind,
    pub name: String,
    /// Rows it holds from the live workers, since each started.
    pub delivered: u64,
    /// Of those, rows a stream had already stored (not sent again).
    pub already_stored: u64,
    /// Of those, rows that committed late (an unnamed stream producer).
    pub late: u64,
    /// Rows a second over the workers' last heartbeat periods.
    pub rate: f64,
    /// Live workers that delivered to it.
    pub workers: usize,
}

/// Every destination a live worker reports, sorted by sink, kind and name.
pub fn fleet(workers: &[WorkerView]) -> Vec<DestinationView> {
    let mut all: Vec<DestinationView> = Vec::new();
    for w in workers.iter().filter(|w| w.live) {
        for d in destinations::parse(w.destinations.as_deref()) {
            let i = match all
                .iter()
                .position(|v| v.kind == d.kind && v.name == d.name)
            {
                Some(i) => i,
                None => {
                    all.push(DestinationView {
                        sink: d.kind.sink(),
                        kind: d.kind,
                        name: d.name.clone(),
                        delivered: 0,
                        already_stored: 0,
                        late: 0,
                        rate: 0.0,
                        workers: 0,
                    });
                    all.len() - 1
                }
            };
            let v = &mut all[i];
            v.delivered += d.delivered;
            v.already_stored += d.already_stored;
            v.late += d.late;
            v.rate += d.rate;
            v.workers += 1;
        }
    }
    all.sort_by(|a, b| (a.sink, a.kind, &a.name).cmp(&(b.sink, b.kind, &b.name)));
    all
}
