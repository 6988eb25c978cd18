//! The OTLP trace export request in protobuf, encoded by hand: the few
//! messages of `opentelemetry/proto/collector/trace/v1` and
//! `.../trace/v1/trace.proto` the relay's spans use, no code generator.
//!
//! Field numbers are the specification's (OTLP 1.x, stable). Empty strings
//! and zero numbers are left out, as protobuf does.

use super::context::TraceParent;
use super::span::{PublishSpan, Resource};

const SPAN_KIND_PRODUCER: u64 = 4;
const STATUS_CODE_ERROR: u64 = 2;

/// `ExportTraceServiceRequest` with one `ResourceSpans` holding one
/// `ScopeSpans` (scope `outboxd`) with every span of `spans`. Each span is
/// encoded once into a reused scratch buffer (its length must precede it);
/// attributes are written in place, their lengths computed.
pub fn export_request(resource: &Resource, spans: &[(&PublishSpan, [u8; 8])]) -> Vec<u8> {
    let mut scope = Vec::new();
    string(&mut scope, 1, "outboxd");
    string(&mut scope, 2, env!("CARGO_PKG_VERSION"));

    let mut scope_spans = Vec::with_capacity(spans.len() * 400 + 64);
    message(&mut scope_spans, 1, &scope);
    let mut scratch = Vec::with_capacity(512);
    for (span, id) in spans {
        scratch.clear();
        encode_span(&mut scratch, span, id);
        message(&mut scope_spans, 2, &scratch);
    }

    let mut res = Vec::new();
    for (k, v) in &resource.attributes {
        key_value(&mut res, 1, k, Value::Str(v));
    }
    let mut resource_spans = Vec::with_capacity(scope_spans.len() + res.len() + 16);
    message(&mut resource_spans, 1, &res);
    message(&mut resource_spans, 2, &scope_spans);

    let mut request = Vec::with_capacity(resource_spans.len() + 8);
    message(&mut request, 1, &resource_spans);
    request
}

fn encode_span(out: &mut Vec<u8>, span: &PublishSpan, span_id: &[u8; 8]) {
    let TraceParent {
        trace_id,
        span_id: parent,
        flags,
    } = span.parent;
    bytes(out, 1, &trace_id);
    bytes(out, 2, span_id);
    if let Some(state) = &span.trace_state {
        string(out, 3, state);
    }
    bytes(out, 4, &parent);
    let destination = if span.exchange.is_empty() {
        "amq.default"
    } else {
        &span.exchange
    };
    // "publish <destination>", without a temporary string.
    tag(out, 5, 2);
    varint(out, (8 + destination.len()) as u64);
    out.extend_from_slice(b"publish ");
    out.extend_from_slice(destination.as_bytes());
    varint_field(out, 6, SPAN_KIND_PRODUCER);
    fixed64(out, 7, span.start_unix_nanos);
    fixed64(out, 8, span.end_unix_nanos);
    let mut message_id = uuid::Uuid::encode_buffer();
    let message_id = span.message_id.hyphenated().encode_lower(&mut message_id);
    let attributes = [
        ("messaging.system", Value::Str("rabbitmq")),
        ("messaging.operation.type", Value::Str("send")),
        ("messaging.operation.name", Value::Str("publish")),
        ("messaging.destination.name", Value::Str(destination)),
        (
            "messaging.rabbitmq.destination.routing_key",
            Value::Str(&span.routing_key),
        ),
        ("messaging.message.id", Value::Str(message_id)),
        ("messaging.message.body.size", Value::Int(span.body_size)),
        ("outboxd.outbox_id", Value::Int(span.outbox_id)),
        ("outboxd.bucket", Value::Str(&span.bucket)),
    ];
    for (k, v) in attributes {
        key_value(out, 9, k, v);
    }
    if let Some(epoch) = span.lease_epoch {
        key_value(out, 9, "outboxd.lease_epoch", Value::Int(epoch));
    }
    if let Some(error) = &span.error {
        let status_len = string_len(error) + 2;
        tag(out, 15, 2);
        varint(out, status_len as u64);
        string(out, 2, error);
        varint_field(out, 3, STATUS_CODE_ERROR);
    }
    // W3C trace flags in the low byte (`SpanFlags`).
    fixed32(out, 16, u32::from(flags));
}

enum Value<'a> {
    Str(&'a str),
    Int(i64),
}

/// A `KeyValue` as field `field`, its `AnyValue` written in place.
fn key_value(out: &mut Vec<u8>, field: u32, key: &str, value: Value<'_>) {
    let any_len = match &value {
        Value::Str(s) => string_len(s),
        Value::Int(0) => 0,
        Value::Int(i) => 1 + varint_len(*i as u64),
    };
    let kv_len = string_len(key) + len_delimited(any_len);
    tag(out, field, 2);
    varint(out, kv_len as u64);
    string(out, 1, key);
    tag(out, 2, 2);
    varint(out, any_len as u64);
    match value {
        Value::Str(s) => string(out, 1, s),
        Value::Int(i) => varint_field(out, 3, i as u64),
    }
}

/// The encoded size of a length-delimited field of `len` bytes (one-byte
/// tag: every field number here is below 16).
fn len_delimited(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

/// The encoded size of [`string`]'s field (nothing when empty).
fn string_len(s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        len_delimited(s.len())
    }
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
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
        for v in [0, 1, 127, 128, 16_383, 16_384, u64::MAX] {
            out.clear();
            varint(&mut out, v);
            assert_eq!(varint_len(v), out.len(), "{v}");
        }
    }

    #[test]
    fn key_values_written_in_place_match_nested_encoding() {
        for (key, value, any) in [
            ("k", Value::Str("v"), b"\x0a\x01v".to_vec()),
            ("", Value::Str(""), Vec::new()),
            ("n", Value::Int(300), b"\x18\xac\x02".to_vec()),
            ("z", Value::Int(0), Vec::new()),
        ] {
            let mut nested = Vec::new();
            string(&mut nested, 1, key);
            message(&mut nested, 2, &any);
            let mut want = Vec::new();
            message(&mut want, 9, &nested);
            let mut got = Vec::new();
            key_value(&mut got, 9, key, value);
            assert_eq!(got, want, "{key}");
        }
    }
}
