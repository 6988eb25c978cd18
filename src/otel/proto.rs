//! The OTLP trace export request in protobuf, encoded by hand: the few
//! messages of `opentelemetry/proto/collector/trace/v1` and
//! `.../trace/v1/trace.proto` the relay's spans use, no code generator.
//!
//! Field numbers are the specification's (OTLP 1.x, stable). Empty strings
//! and zero numbers are left out, as protobuf does.

use super::context::TraceParent;
use super::export::{PublishSpan, Resource};

const SPAN_KIND_PRODUCER: u64 = 4;
const STATUS_CODE_ERROR: u64 = 2;

/// `ExportTraceServiceRequest` with one `ResourceSpans` holding one
/// `ScopeSpans` (scope `outboxd`) with every span of `spans`.
pub fn export_request(resource: &Resource, spans: &[(&PublishSpan, [u8; 8])]) -> Vec<u8> {
    let mut scope = Vec::new();
    string(&mut scope, 1, "outboxd");
    string(&mut scope, 2, env!("CARGO_PKG_VERSION"));

    let mut scope_spans = Vec::new();
    message(&mut scope_spans, 1, &scope);
    for (span, id) in spans {
        message(&mut scope_spans, 2, &encode_span(span, id));
    }

    let mut res = Vec::new();
    for (k, v) in &resource.attributes {
        message(&mut res, 1, &key_value(k, Value::Str(v)));
    }
    let mut resource_spans = Vec::new();
    message(&mut resource_spans, 1, &res);
    message(&mut resource_spans, 2, &scope_spans);

    let mut request = Vec::new();
    message(&mut request, 1, &resource_spans);
    request
}

fn encode_span(span: &PublishSpan, span_id: &[u8; 8]) -> Vec<u8> {
    let TraceParent {
        trace_id,
        span_id: parent,
        flags,
    } = span.parent;
    let mut out = Vec::with_capacity(256);
    bytes(&mut out, 1, &trace_id);
    bytes(&mut out, 2, span_id);
    if let Some(state) = &span.trace_state {
        string(&mut out, 3, state);
    }
    bytes(&mut out, 4, &parent);
    let name = if span.exchange.is_empty() {
        "publish amq.default".to_string()
    } else {
        format!("publish {}", span.exchange)
    };
    string(&mut out, 5, &name);
    varint_field(&mut out, 6, SPAN_KIND_PRODUCER);
    fixed64(&mut out, 7, span.start_unix_nanos);
    fixed64(&mut out, 8, span.end_unix_nanos);
    let destination = if span.exchange.is_empty() {
        "amq.default"
    } else {
        &span.exchange
    };
    let attributes = [
        ("messaging.system", Value::Str("rabbitmq")),
        ("messaging.operation.type", Value::Str("send")),
        ("messaging.operation.name", Value::Str("publish")),
        ("messaging.destination.name", Value::Str(destination)),
        (
            "messaging.rabbitmq.destination.routing_key",
            Value::Str(&span.routing_key),
        ),
        ("messaging.message.id", Value::Str(&span.message_id)),
        ("messaging.message.body.size", Value::Int(span.body_size)),
        ("outboxd.outbox_id", Value::Int(span.outbox_id)),
        ("outboxd.bucket", Value::Str(&span.bucket)),
    ];
    for (k, v) in attributes {
        message(&mut out, 9, &key_value(k, v));
    }
    if let Some(epoch) = span.lease_epoch {
        message(
            &mut out,
            9,
            &key_value("outboxd.lease_epoch", Value::Int(epoch)),
        );
    }
    if let Some(error) = &span.error {
        let mut status = Vec::new();
        string(&mut status, 2, error);
        varint_field(&mut status, 3, STATUS_CODE_ERROR);
        message(&mut out, 15, &status);
    }
    // W3C trace flags in the low byte (`SpanFlags`).
    fixed32(&mut out, 16, u32::from(flags));
    out
}

enum Value<'a> {
    Str(&'a str),
    Int(i64),
}

fn key_value(key: &str, value: Value<'_>) -> Vec<u8> {
    let mut any = Vec::new();
    match value {
        Value::Str(s) => string(&mut any, 1, s),
        Value::Int(i) => varint_field(&mut any, 3, i as u64),
    }
    let mut kv = Vec::with_capacity(key.len() + any.len() + 4);
    string(&mut kv, 1, key);
    message(&mut kv, 2, &any);
    kv
}

fn tag(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    varint(out, u64::from(field) << 3 | u64::from(wire_type));
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        tag(out, field, 0);
        varint(out, v);
    }
}

fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, 1);
    out.extend_from_slice(&v.to_le_bytes());
}

fn fixed32(out: &mut Vec<u8>, field: u32, v: u32) {
    tag(out, field, 5);
    out.extend_from_slice(&v.to_le_bytes());
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    tag(out, field, 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn string(out: &mut Vec<u8>, field: u32, s: &str) {
    if !s.is_empty() {
        bytes(out, field, s.as_bytes());
    }
}

/// An embedded message, written even when empty (its presence matters).
fn message(out: &mut Vec<u8>, field: u32, encoded: &[u8]) {
    bytes(out, field, encoded);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_match_the_protobuf_documentation() {
        let mut out = Vec::new();
        varint(&mut out, 150);
        assert_eq!(out, [0x96, 0x01]);
        out.clear();
        varint_field(&mut out, 1, 150);
        assert_eq!(out, [0x08, 0x96, 0x01]);
        out.clear();
        string(&mut out, 2, "testing");
        assert_eq!(out, b"\x12\x07testing");
        out.clear();
        // A negative int64 is ten bytes, as protobuf writes it.
        varint(&mut out, -1i64 as u64);
        assert_eq!(out.len(), 10);
    }
}
