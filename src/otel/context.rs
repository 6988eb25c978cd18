//! W3C trace context: the `traceparent` and `tracestate` headers
//! (<https://www.w3.org/TR/trace-context/>), parsed strictly and written
//! back byte for byte.
//!
//! A producer stores them in the row's headers; the relay copies every
//! header to the AMQP message unchanged, so the consumer continues the
//! producer's trace whether or not outboxd exports spans of its own.

use std::fmt;

/// The `traceparent` header: trace id, parent span id, trace flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` value. Version `00` must be exactly 55
    /// characters; a later version may carry more after a `-` (read as
    /// `00`, as the specification asks). Upper-case hex, version `ff`, an
    /// all-zero trace or span id are invalid: `None`.
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        let b = value.as_bytes();
        if b.len() < 55 {
            return None;
        }
        let version = hex_byte(&b[0..2])?;
        if version == 0xff || (version == 0 && b.len() != 55) {
            return None;
        }
        if b.len() > 55 && b[55] != b'-' {
            return None;
        }
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let mut trace_id = [0u8; 16];
        for (i, byte) in trace_id.iter_mut().enumerate() {
            *byte = hex_byte(&b[3 + 2 * i..5 + 2 * i])?;
        }
        let mut span_id = [0u8; 8];
        for (i, byte) in span_id.iter_mut().enumerate() {
            *byte = hex_byte(&b[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&b[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            flags,
        })
    }

    /// Whether the producer sampled this trace (flag `01`): the relay
    /// exports spans only for sampled traces, as a parent-based sampler
    /// does.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.span_id),
            self.flags
        )
    }
}

/// A span's context as a producer hands it over: its `traceparent` and,
/// when the trace has vendor state, its `tracestate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    pub parent: TraceParent,
    pub state: Option<String>,
}

impl TraceContext {
    /// The context of the span `span_id` in trace `trace_id`.
    pub fn new(trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) -> Self {
        Self {
            parent: TraceParent {
                trace_id,
                span_id,
                flags: u8::from(sampled),
            },
            state: None,
        }
    }

    /// From the two header values; `None` when `traceparent` is invalid.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        Some(Self {
            parent: TraceParent::parse(traceparent)?,
            state: tracestate
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        })
    }

    /// Sets the `tracestate` value (vendor entries, passed on as they are).
    pub fn with_state(mut self, state: impl Into<String>) -> Self {
        let state = state.into();
        self.state = (!state.trim().is_empty()).then_some(state);
        self
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(digit(two[0])? << 4 | digit(two[1])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_writes_back_the_specification_example() {
        let p = TraceParent::parse(VALID).unwrap();
        assert_eq!(hex(&p.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&p.span_id), "00f067aa0ba902b7");
        assert!(p.sampled());
        assert_eq!(p.to_string(), VALID);
    }

    #[test]
    fn refuses_what_the_specification_refuses() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_later_version_is_read_as_version_00() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more";
        let p = TraceParent::parse(later).unwrap();
        assert!(!p.sampled());
        assert_eq!(
            p.to_string(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
        );
    }
}
