//! What the relay records of a published message: the span it becomes.

use std::time::SystemTime;

use super::context::TraceParent;

/// One published (or failed) message's span, a child of the row's trace.
#[derive(Debug, Clone)]
pub struct PublishSpan {
    /// The producer's span: this span's parent and trace.
    pub parent: TraceParent,
    pub trace_state: Option<String>,
    pub started: SystemTime,
    pub ended: SystemTime,
    pub outbox_id: i64,
    pub message_id: uuid::Uuid,
    pub bucket: String,
    pub lease_epoch: Option<i64>,
    pub exchange: String,
    pub routing_key: String,
    pub body_size: i64,
    /// Why the publish failed; `None` when confirmed.
    pub error: Option<String>,
}
