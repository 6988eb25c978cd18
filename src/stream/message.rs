//! The stream message a row becomes: its payload as the body, its
//! message id, content type and creation time as AMQP 1.0 properties, and
//! its JSON headers with the `outbox-*` headers ([`crate::amqp`]'s) as
//! application properties.

use rabbitmq_stream_protocol::message::{Message, SimpleValue};
use serde_json::Value as Json;

use crate::amqp::{HEADER_ID, HEADER_LEASE_EPOCH, HEADER_MESSAGE_KEY, HEADER_PARTITION_KEY};
use crate::sink::{PublishError, PublishLimits};
use crate::store::outbox::ClaimedMessage;

/// The stream message for `row`: its payload as the body, its message id,
/// content type and creation time as properties, and its JSON headers with
/// the `outbox-*` headers as application properties (strings and
/// booleans as such, whole numbers as [`whole`] says; other numbers,
/// objects and arrays as their JSON text).
pub fn stream_message(
    row: &ClaimedMessage,
    limits: &PublishLimits,
) -> Result<Message, PublishError> {
    let max = limits.max_payload_bytes;
    if row.payload.len() as u64 > max {
        return Err(PublishError::Rejected(format!(
            "payload is {} bytes, more than outbox.max_payload_bytes ({max})",
            row.payload.len()
        )));
    }
    let headers = match &row.headers {
        Json::Object(map) => map,
        other => {
            return Err(PublishError::Rejected(format!(
                "invalid headers: expected a JSON object, found {other}"
            )));
        }
    };
    let mut properties = Message::builder()
        .body(row.payload.clone())
        .properties()
        .message_id(row.message_id.to_string())
        .creation_time(row.created_at);
    if let Some(content_type) = &row.content_type {
        properties = properties.content_type(content_type.as_str());
    }
    let mut application = properties.message_builder().application_properties();
    for (name, value) in headers {
        application = application.insert(name.as_str(), simple_value(value));
    }
    application = application
        .insert(HEADER_ID, whole(row.id))
        .insert(HEADER_PARTITION_KEY, row.partition_key.as_str())
        .insert(HEADER_MESSAGE_KEY, row.message_key.as_str());
    if let Some(epoch) = limits.lease_epoch {
        application = application.insert(HEADER_LEASE_EPOCH, whole(epoch));
    }
    Ok(application.message_builder().build())
}

/// A whole number as AMQP 1.0 `ulong` (≥ 0), else `long` — or `int` from
/// -128 to -1: the codec (rabbitmq-stream-protocol 0.11) counts a
/// one-byte `long` as three bytes where it writes two, and the broker then
/// drops the connection on the frame.
fn whole(n: i64) -> SimpleValue {
    match n {
        0.. => SimpleValue::Ulong(n as u64),
        -128..0 => SimpleValue::Int(n as i32),
        _ => SimpleValue::Long(n),
    }
}

fn simple_value(value: &Json) -> SimpleValue {
    match value {
        Json::Null => SimpleValue::Null,
        Json::Bool(b) => SimpleValue::Boolean(*b),
        Json::String(s) => SimpleValue::String(s.clone()),
        Json::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => SimpleValue::Ulong(u),
            (None, Some(i)) => whole(i),
            _ => SimpleValue::String(n.to_string()),
        },
        other => SimpleValue::String(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_whole_number_encodes_in_the_size_the_frame_says() {
        use rabbitmq_stream_protocol::codec::Encoder;
        for n in [i64::MIN, -129, -128, -1, 0, 1, 127, 128, i64::MAX] {
            let m = Message::builder()
                .body("x")
                .application_properties()
                .insert("n", whole(n))
                .message_builder()
                .build();
            let mut bytes = Vec::new();
            m.encode(&mut bytes).unwrap();
            assert_eq!(m.encoded_size() as usize, bytes.len(), "{n}");
        }
    }
}
