//! The relay's spans: a batch's outcome turned into one
//! [`PublishSpan`] per row of a sampled trace (`otel`).
//!
//! A row gets a span when its headers carry a valid `traceparent` whose
//! sampled flag is set: the producer decided, the relay follows (a
//! parent-based sampler). Confirmed rows get a plain span; the row that
//! failed gets one with an error status when the failure counts as an
//! attempt at it (a rejection, a missing confirm) — not when the broker
//! or the lease went away, which says nothing about the message.

use std::time::SystemTime;

use crate::otel::{PublishSpan, TraceParent};
use crate::sink::PublishError;
use crate::store::outbox::ClaimedMessage;

/// When a batch's publish started and ended, and under which lease epoch.
pub(crate) struct BatchTimes {
    pub started: SystemTime,
    pub ended: SystemTime,
    pub lease_epoch: Option<i64>,
}

/// The spans of `rows`, of which the first `confirmed` were confirmed and
/// the next one, if `failure` is set, failed.
pub(crate) fn of_batch(
    rows: &[ClaimedMessage],
    confirmed: usize,
    failure: Option<&PublishError>,
    times: &BatchTimes,
) -> Vec<PublishSpan> {
    let failed = failure
        .filter(|f| f.counts_attempt())
        .and_then(|f| Some((rows.get(confirmed)?, f.to_string())));
    rows[..confirmed]
        .iter()
        .map(|row| (row, None))
        .chain(failed.map(|(row, e)| (row, Some(e))))
        .filter_map(|(row, error)| span(row, error, times))
        .collect()
}

fn span(row: &ClaimedMessage, error: Option<String>, times: &BatchTimes) -> Option<PublishSpan> {
    let header = |name: &str| row.headers.get(name).and_then(|v| v.as_str());
    let parent = TraceParent::parse(header("traceparent")?).filter(TraceParent::sampled)?;
    Some(PublishSpan {
        parent,
        trace_state: header("tracestate").map(str::to_string),
        started: times.started,
        ended: times.ended,
        outbox_id: row.id,
        message_id: row.message_id,
        bucket: row.partition_key.clone(),
        lease_epoch: times.lease_epoch,
        exchange: row.exchange.clone(),
        routing_key: row.routing_key.clone(),
        body_size: row.payload.len() as i64,
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(id: i64, headers: serde_json::Value) -> ClaimedMessage {
        ClaimedMessage {
            id,
            message_id: uuid::Uuid::new_v4(),
            partition_key: "p03".into(),
            message_key: "k".into(),
            exchange: String::new(),
            routing_key: "q".into(),
            headers,
            content_type: None,
            payload: vec![1, 2, 3],
            attempts: 0,
            created_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn only_sampled_traces_get_spans_and_the_failed_row_an_error() {
        let sampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        let rows = [
            row(1, json!({ "traceparent": sampled, "tracestate": "v=1" })),
            row(2, json!({ "traceparent": unsampled })),
            row(3, json!({})),
            row(4, json!({ "traceparent": "garbage" })),
            row(5, json!({ "traceparent": sampled })),
            row(6, json!({ "traceparent": sampled })),
        ];
        let times = BatchTimes {
            started: SystemTime::now(),
            ended: SystemTime::now(),
            lease_epoch: Some(7),
        };
        let rejected = PublishError::Rejected("unroutable".into());
        let spans = of_batch(&rows, 4, Some(&rejected), &times);
        let ids: Vec<i64> = spans.iter().map(|s| s.outbox_id).collect();
        assert_eq!(ids, [1, 5]);
        assert_eq!(spans[0].trace_state.as_deref(), Some("v=1"));
        assert_eq!(spans[0].error, None);
        assert_eq!(spans[1].error.as_deref(), Some("unroutable"));
        assert_eq!(spans[1].lease_epoch, Some(7));
        // A lost broker says nothing about the row: no error span.
        let lost = PublishError::Unavailable("gone".into());
        assert_eq!(of_batch(&rows, 4, Some(&lost), &times).len(), 1);
    }
}
