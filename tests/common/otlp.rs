//! A small OTLP/HTTP receiver for the tests: it keeps every export request
//! posted to `/v1/traces` and decodes the spans from protobuf with its own
//! reader of the wire format (independent of the relay's encoder).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::routing::post;

/// One decoded span with what the tests look at.
#[derive(Debug, Clone)]
pub struct Span {
    pub trace_id: Vec<u8>,
    pub span_id: Vec<u8>,
    pub parent_span_id: Vec<u8>,
    pub trace_state: String,
    pub name: String,
    pub kind: u64,
    pub start: u64,
    pub end: u64,
    pub attributes: HashMap<String, Value>,
    /// `(code, message)`; `None` when no status was set.
    pub status: Option<(u64, String)>,
    /// The resource's attributes.
    pub resource: HashMap<String, Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
}

/// What the receiver got.
#[derive(Default)]
struct Received {
    requests: Vec<(HeaderMap, Bytes)>,
}

pub struct Receiver {
    pub endpoint: String,
    received: Arc<Mutex<Received>>,
    _server: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// Listens on a free loopback port.
    pub async fn start() -> Self {
        let received: Arc<Mutex<Received>> = Arc::default();
        let kept = received.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            post(move |headers: HeaderMap, body: Bytes| {
                let kept = kept.clone();
                async move {
                    kept.lock().unwrap().requests.push((headers, body));
                    // An empty ExportTraceServiceResponse.
                    (
                        [("content-type", "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            endpoint,
            received,
            _server: server,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        let received = self.received.lock().unwrap();
        received
            .requests
            .iter()
            .flat_map(|(_, body)| decode_request(body))
            .collect()
    }

    /// The headers of every request received so far.
    pub fn request_headers(&self) -> Vec<HeaderMap> {
        let received = self.received.lock().unwrap();
        received.requests.iter().map(|(h, _)| h.clone()).collect()
    }
}

/// A protobuf field: (number, value).
enum Field<'a> {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
    Bytes(&'a [u8]),
}

fn fields(mut buf: &[u8]) -> Vec<(u64, Field<'_>)> {
    fn varint(buf: &mut &[u8]) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = buf[0];
            *buf = &buf[1..];
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                break;
            }
        }
        v
    }
    let mut out = Vec::new();
    while !buf.is_empty() {
        let tag = varint(&mut buf);
        let field = match tag & 7 {
            0 => Field::Varint(varint(&mut buf)),
            1 => {
                let v = u64::from_le_bytes(buf[..8].try_into().unwrap());
                buf = &buf[8..];
                Field::Fixed64(v)
            }
            2 => {
                let len = varint(&mut buf) as usize;
                let (b, rest) = buf.split_at(len);
                buf = rest;
                Field::Bytes(b)
            }
            5 => {
                let v = u32::from_le_bytes(buf[..4].try_into().unwrap());
                buf = &buf[4..];
                Field::Fixed32(v)
            }
            t => panic!("unexpected wire type {t}"),
        };
        out.push((tag >> 3, field));
    }
    out
}

fn embedded<'a>(fs: &[(u64, Field<'a>)], n: u64) -> Vec<&'a [u8]> {
    fs.iter()
        .filter_map(|(k, f)| match f {
            Field::Bytes(b) if *k == n => Some(*b),
            _ => None,
        })
        .collect()
}

fn text(fs: &[(u64, Field<'_>)], n: u64) -> String {
    embedded(fs, n)
        .first()
        .map(|b| String::from_utf8(b.to_vec()).unwrap())
        .unwrap_or_default()
}

fn attributes(fs: &[(u64, Field<'_>)], n: u64) -> HashMap<String, Value> {
    embedded(fs, n)
        .into_iter()
        .map(|kv| {
            let kv = fields(kv);
            let any = fields(embedded(&kv, 2)[0]);
            let value = match &any[0] {
                (1, Field::Bytes(b)) => Value::Str(String::from_utf8(b.to_vec()).unwrap()),
                (3, Field::Varint(v)) => Value::Int(*v as i64),
                (k, _) => panic!("unexpected AnyValue field {k}"),
            };
            (text(&kv, 1), value)
        })
        .collect()
}

fn decode_request(body: &[u8]) -> Vec<Span> {
    let mut spans = Vec::new();
    for resource_spans in embedded(&fields(body), 1) {
        let rs = fields(resource_spans);
        let resource = embedded(&rs, 1)
            .first()
            .map(|r| attributes(&fields(r), 1))
            .unwrap_or_default();
        for scope_spans in embedded(&rs, 2) {
            for span in embedded(&fields(scope_spans), 2) {
                let f = fields(span);
                let bytes = |n| {
                    embedded(&f, n)
                        .first()
                        .map(|b| b.to_vec())
                        .unwrap_or_default()
                };
                let number = |n| {
                    f.iter()
                        .find_map(|(k, v)| match v {
                            Field::Varint(x) | Field::Fixed64(x) if *k == n => Some(*x),
                            Field::Fixed32(x) if *k == n => Some(u64::from(*x)),
                            _ => None,
                        })
                        .unwrap_or(0)
                };
                let status = embedded(&f, 15).first().map(|s| {
                    let s = fields(s);
                    let code = s
                        .iter()
                        .find_map(|(k, v)| match v {
                            Field::Varint(x) if *k == 3 => Some(*x),
                            _ => None,
                        })
                        .unwrap_or(0);
                    (code, text(&s, 2))
                });
                spans.push(Span {
                    trace_id: bytes(1),
                    span_id: bytes(2),
                    trace_state: text(&f, 3),
                    parent_span_id: bytes(4),
                    name: text(&f, 5),
                    kind: number(6),
                    start: number(7),
                    end: number(8),
                    attributes: attributes(&f, 9),
                    status,
                    resource: resource.clone(),
                });
            }
        }
    }
    spans
}
