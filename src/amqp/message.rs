//! The AMQP message a row becomes: its JSON headers as an AMQP table, the
//! `outbox-*` headers, and the properties (persistent, message id,
//! timestamp, app id, content type). The stream sink sends the same
//! headers as application properties ([`crate::stream`]).

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use serde_json::Value as Json;

use crate::sink::PublishError;
use crate::store::outbox::ClaimedMessage;

/// Header carrying the outbox row id.
pub const HEADER_ID: &str = "outbox-id";
/// Header carrying the bucket label.
pub const HEADER_PARTITION_KEY: &str = "outbox-partition-key";
/// Header carrying the message key.
pub const HEADER_MESSAGE_KEY: &str = "outbox-message-key";
/// Header carrying the lease epoch the message was published under (fleet
/// mode only): consumers and tests can tell which lease published what.
pub const HEADER_LEASE_EPOCH: &str = "outbox-lease-epoch";

/// Deepest nesting of JSON headers converted to AMQP tables.
const MAX_HEADER_DEPTH: usize = 16;

/// The AMQP properties the relay sends `row` with: its JSON headers plus
/// the `outbox-*` headers (`lease_epoch` stamped when set), persistent
/// delivery, message id, timestamp, app id and content type. Public so
/// that the benchmark's ceiling sends the same messages as the relay.
pub fn message_properties(
    row: &ClaimedMessage,
    lease_epoch: Option<i64>,
) -> Result<BasicProperties, PublishError> {
    let mut headers = match &row.headers {
        Json::Object(map) => json_table(map, 0)
            .map_err(|e| PublishError::Rejected(format!("invalid headers: {e}")))?,
        other => {
            return Err(PublishError::Rejected(format!(
                "invalid headers: expected a JSON object, found {}",
                json_kind(other)
            )));
        }
    };
    headers.insert(HEADER_ID.into(), AMQPValue::LongLongInt(row.id));
    headers.insert(
        HEADER_PARTITION_KEY.into(),
        AMQPValue::LongString(row.partition_key.as_str().into()),
    );
    headers.insert(
        HEADER_MESSAGE_KEY.into(),
        AMQPValue::LongString(row.message_key.as_str().into()),
    );
    if let Some(epoch) = lease_epoch {
        headers.insert(HEADER_LEASE_EPOCH.into(), AMQPValue::LongLongInt(epoch));
    }
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(row.message_id.to_string().into())
        .with_timestamp(row.created_at.timestamp().max(0) as u64)
        .with_app_id("outboxd".into())
        .with_headers(headers);
    if let Some(ct) = &row.content_type {
        let ct = ShortString::try_new(ct.as_str())
            .map_err(|e| PublishError::Rejected(format!("invalid content_type: {e}")))?;
        properties = properties.with_content_type(ct);
    }
    Ok(properties)
}

fn json_kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

fn json_table(map: &serde_json::Map<String, Json>, depth: usize) -> Result<FieldTable, String> {
    let mut table = FieldTable::default();
    for (k, v) in map {
        let key = ShortString::try_new(k.as_str()).map_err(|_| {
            format!(
                "header name '{}…' is longer than 255 bytes",
                k.chars().take(20).collect::<String>()
            )
        })?;
        table.insert(key, json_value(v, depth + 1)?);
    }
    Ok(table)
}

fn json_value(v: &Json, depth: usize) -> Result<AMQPValue, String> {
    if depth > MAX_HEADER_DEPTH {
        return Err(format!("nested deeper than {MAX_HEADER_DEPTH} levels"));
    }
    Ok(match v {
        Json::Null => AMQPValue::Void,
        Json::Bool(b) => AMQPValue::Boolean(*b),
        Json::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => AMQPValue::LongLongInt(i),
            (None, Some(f)) => AMQPValue::Double(f),
            (None, None) => return Err(format!("number {n} does not fit an AMQP header")),
        },
        Json::String(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        Json::Array(items) => AMQPValue::FieldArray(FieldArray::from(
            items
                .iter()
                .map(|i| json_value(i, depth + 1))
                .collect::<Result<Vec<_>, _>>()?,
        )),
        Json::Object(map) => AMQPValue::FieldTable(json_table(map, depth)?),
    })
}
