//! What the sinks delivered where: rows per destination — a queue (the
//! default exchange, named by the routing key), an exchange, or a stream —
//! counted by the sink that delivered them. A worker writes its totals and
//! rates with each heartbeat (the worker row's `destinations`); the
//! dashboard and `outboxd status` add up the live workers' rows; `/metrics`
//! and OTLP read the serving worker's own totals.
//!
//! At most [`MAX_DESTINATIONS`] destinations are told apart per worker;
//! rows for any further one are counted under [`OTHERS`], so the worker row
//! and the metrics' labels stay bounded whatever names rows carry.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::store::outbox::ClaimedMessage;

/// Destinations told apart per worker.
pub const MAX_DESTINATIONS: usize = 64;

/// The name rows for destinations beyond [`MAX_DESTINATIONS`] are counted
/// under.
pub const OTHERS: &str = "(others)";

/// What a destination is, which says the sink that delivers to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A queue, through the default exchange (the row's `exchange` is
    /// empty, its `routing_key` names the queue).
    Queue,
    /// An exchange (the row's `exchange`).
    Exchange,
    /// A stream of `amqp.streams`, through the stream protocol.
    Stream,
}

impl Kind {
    /// The sink that delivers to it: `amqp` or `stream`.
    pub fn sink(self) -> &'static str {
        match self {
            Kind::Queue | Kind::Exchange => "amqp",
            Kind::Stream => "stream",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Queue => "queue",
            Kind::Exchange => "exchange",
            Kind::Stream => "stream",
        }
    }
}

/// Where the AMQP sink delivers a row: the exchange it names or, through
/// the default exchange, the queue its routing key names.
pub fn amqp_destination(row: &ClaimedMessage) -> (Kind, &str) {
    if row.exchange.is_empty() {
        (Kind::Queue, &row.routing_key)
    } else {
        (Kind::Exchange, &row.exchange)
    }
}

/// A destination's counts since the worker started.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    /// Rows the destination holds: confirmed by the broker or, for a
    /// stream, found already stored.
    pub delivered: u64,
    /// Of those, rows found at or below a stream producer's last stored
    /// id and recorded without being sent again.
    pub already_stored: u64,
    /// Of those, rows committed after later rows of their bucket were
    /// stored, sent through an unnamed stream producer.
    pub late: u64,
}

/// One destination's totals.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivered {
    pub kind: Kind,
    pub name: String,
    pub totals: Totals,
}

/// Every destination's totals, shared by a worker's sinks.
#[derive(Debug, Default)]
pub struct Destinations {
    by: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    by_kind: BTreeMap<Kind, BTreeMap<String, Totals>>,
    told_apart: usize,
}

impl Table {
    fn entry(&mut self, kind: Kind, name: &str) -> &mut Totals {
        let full = self.told_apart >= MAX_DESTINATIONS;
        let names = self.by_kind.entry(kind).or_default();
        let name = if names.contains_key(name) || !full {
            name
        } else {
            OTHERS
        };
        if !names.contains_key(name) {
            self.told_apart += usize::from(name != OTHERS);
            names.insert(name.to_string(), Totals::default());
        }
        names.get_mut(name).expect("just inserted")
    }
}

impl Destinations {
    /// Changes `name`'s totals (those of [`OTHERS`] when
    /// [`MAX_DESTINATIONS`] are told apart already).
    pub fn add(&self, kind: Kind, name: &str, change: impl FnOnce(&mut Totals)) {
        change(self.lock().entry(kind, name));
    }

    /// Counts `rows` delivered by the AMQP sink (one lock for the lot).
    pub fn count_amqp(&self, rows: &[ClaimedMessage]) {
        if rows.is_empty() {
            return;
        }
        let mut table = self.lock();
        let mut start = 0;
        while start < rows.len() {
            let to = amqp_destination(&rows[start]);
            let end = rows[start..]
                .iter()
                .position(|r| amqp_destination(r) != to)
                .map_or(rows.len(), |n| start + n);
            table.entry(to.0, to.1).delivered += (end - start) as u64;
            start = end;
        }
    }

    /// Every destination's totals, by kind and name.
    pub fn snapshot(&self) -> Vec<Delivered> {
        let table = self.lock();
        table
            .by_kind
            .iter()
            .flat_map(|(kind, names)| {
                names.iter().map(|(name, totals)| Delivered {
                    kind: *kind,
                    name: name.clone(),
                    totals: *totals,
                })
            })
            .collect()
    }

    /// The sum of one figure over the destinations of `kind`.
    pub fn sum(&self, kind: Kind, figure: fn(&Totals) -> u64) -> u64 {
        self.lock()
            .by_kind
            .get(&kind)
            .map_or(0, |names| names.values().map(figure).sum())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.by.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A destination as a worker's heartbeat reports it (the worker row's
/// `destinations` column holds a JSON array of these).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reported {
    pub kind: Kind,
    pub name: String,
    /// [`Totals::delivered`] since the worker started.
    pub delivered: u64,
    #[serde(default)]
    pub already_stored: u64,
    #[serde(default)]
    pub late: u64,
    /// Rows a second delivered over the last heartbeat period.
    pub rate: f64,
}

/// `now`'s destinations with their rates since `before`, `seconds` ago,
/// as the worker row's `destinations`: a JSON array, empty text when
/// nothing was delivered yet.
pub fn report(now: &[Delivered], before: &[Delivered], seconds: f64) -> String {
    if now.is_empty() {
        return String::new();
    }
    let reported: Vec<Reported> = now
        .iter()
        .map(|d| {
            let earlier = before
                .iter()
                .find(|b| b.kind == d.kind && b.name == d.name)
                .map_or(0, |b| b.totals.delivered);
            let rate =
                (d.totals.delivered - earlier.min(d.totals.delivered)) as f64 / seconds.max(1e-3);
            Reported {
                kind: d.kind,
                name: d.name.clone(),
                delivered: d.totals.delivered,
                already_stored: d.totals.already_stored,
                late: d.totals.late,
                rate: (rate * 100.0).round() / 100.0,
            }
        })
        .collect();
    serde_json::to_string(&reported).unwrap_or_default()
}

/// The destinations a worker row reports (nothing for a row without them,
/// or one an incompatible version wrote).
pub fn parse(column: Option<&str>) -> Vec<Reported> {
    column
        .filter(|c| !c.is_empty())
        .and_then(|c| serde_json::from_str(c).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(exchange: &str, routing_key: &str) -> ClaimedMessage {
        ClaimedMessage {
            id: 1,
            message_id: uuid::Uuid::nil(),
            partition_key: "p00".into(),
            message_key: "k".into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            headers: serde_json::json!({}),
            content_type: None,
            payload: Vec::new(),
            attempts: 0,
            created_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn amqp_rows_count_by_exchange_or_queue() {
        let d = Destinations::default();
        d.count_amqp(&[
            row("", "jobs"),
            row("", "jobs"),
            row("events", "a.b"),
            row("events", "c.d"),
            row("", "jobs"),
        ]);
        d.add(Kind::Stream, "orders", |t| {
            t.delivered += 3;
            t.late += 1;
        });
        let got: Vec<(Kind, String, u64)> = d
            .snapshot()
            .into_iter()
            .map(|x| (x.kind, x.name, x.totals.delivered))
            .collect();
        assert_eq!(
            got,
            vec![
                (Kind::Queue, "jobs".to_string(), 3),
                (Kind::Exchange, "events".to_string(), 2),
                (Kind::Stream, "orders".to_string(), 3),
            ]
        );
        assert_eq!(d.sum(Kind::Stream, |t| t.late), 1);
    }

    #[test]
    fn destinations_beyond_the_limit_count_as_others() {
        let d = Destinations::default();
        for n in 0..MAX_DESTINATIONS + 10 {
            d.count_amqp(&[row("", &format!("q{n}"))]);
        }
        // A destination told apart keeps its own count.
        d.count_amqp(&[row("", "q0")]);
        let all = d.snapshot();
        assert_eq!(all.len(), MAX_DESTINATIONS + 1);
        let others = all.iter().find(|x| x.name == OTHERS).unwrap();
        assert_eq!(others.totals.delivered, 10);
        assert_eq!(
            all.iter()
                .find(|x| x.name == "q0")
                .unwrap()
                .totals
                .delivered,
            2
        );
    }

    #[test]
    fn a_report_reads_back_with_its_rates() {
        let d = Destinations::default();
        d.count_amqp(&[row("", "jobs")]);
        let before = d.snapshot();
        d.count_amqp(&[row("", "jobs"), row("", "jobs"), row("x", "y")]);
        let text = report(&d.snapshot(), &before, 2.0);
        let back = parse(Some(&text));
        assert_eq!(back.len(), 2);
        assert_eq!(
            (back[0].name.as_str(), back[0].delivered, back[0].rate),
            ("jobs", 3, 1.0)
        );
        assert_eq!(
            (back[1].name.as_str(), back[1].delivered, back[1].rate),
            ("x", 1, 0.5)
        );
        assert!(report(&[], &[], 1.0).is_empty());
        assert!(parse(Some("not json")).is_empty());
        assert!(parse(None).is_empty());
    }
}
