//! A small OTLP/HTTP receiver for the tests: it keeps every export request
//! posted to `/v1/traces` and `/v1/metrics` and decodes them with
//! OpenTelemetry's own protobuf messages (`opentelemetry-proto`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use prost::Message as _;

/// One decoded span with what the tests look at.
#[derive(Debug, Clone)]
pub struct Span {
    pub trace_id: Vec<u8>,
    pub span_id: Vec<u8>,
    pub parent_span_id: Vec<u8>,
    pub trace_state: String,
    pub name: String,
    pub kind: i32,
    pub start: u64,
    pub end: u64,
    pub attributes: HashMap<String, Value>,
    /// `(code, message)`; `None` when the status is unset.
    pub status: Option<(i32, String)>,
    /// The resource's attributes.
    pub resource: HashMap<String, Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Other,
}

/// What the receiver got, by path.
#[derive(Default)]
struct Received {
    traces: Vec<(HeaderMap, Bytes)>,
    metrics: Vec<(HeaderMap, Bytes)>,
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
        let keep = |pick: fn(&mut Received) -> &mut Vec<(HeaderMap, Bytes)>| {
            let kept = received.clone();
            post(move |headers: HeaderMap, body: Bytes| {
                let kept = kept.clone();
                async move {
                    pick(&mut kept.lock().unwrap()).push((headers, body));
                    // An empty export response.
                    (
                        [("content-type", "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }
            })
        };
        let app = axum::Router::new()
            .route("/v1/traces", keep(|r| &mut r.traces))
            .route("/v1/metrics", keep(|r| &mut r.metrics));
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
        let mut spans = Vec::new();
        for (_, body) in &received.traces {
            let request = ExportTraceServiceRequest::decode(body.as_ref())
                .expect("an ExportTraceServiceRequest");
            for rs in request.resource_spans {
                let resource = rs
                    .resource
                    .map(|r| attributes(&r.attributes))
                    .unwrap_or_default();
                for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                    spans.push(Span {
                        trace_id: span.trace_id,
                        span_id: span.span_id,
                        parent_span_id: span.parent_span_id,
                        trace_state: span.trace_state,
                        name: span.name,
                        kind: span.kind,
                        start: span.start_time_unix_nano,
                        end: span.end_time_unix_nano,
                        attributes: attributes(&span.attributes),
                        status: span
                            .status
                            .filter(|s| s.code != 0)
                            .map(|s| (s.code, s.message)),
                        resource: resource.clone(),
                    });
                }
            }
        }
        spans
    }

    /// The last value received of every integer sum (a counter), by
    /// `service.instance.id` and name.
    pub fn counters(&self) -> HashMap<(String, String), i64> {
        let received = self.received.lock().unwrap();
        let mut counters = HashMap::new();
        for (_, body) in &received.metrics {
            let request = ExportMetricsServiceRequest::decode(body.as_ref())
                .expect("an ExportMetricsServiceRequest");
            for rm in request.resource_metrics {
                let resource = rm
                    .resource
                    .map(|r| attributes(&r.attributes))
                    .unwrap_or_default();
                let instance = match resource.get("service.instance.id") {
                    Some(Value::Str(id)) => id.clone(),
                    _ => String::new(),
                };
                for m in rm.scope_metrics.into_iter().flat_map(|s| s.metrics) {
                    let Some(metric::Data::Sum(sum)) = m.data else {
                        continue;
                    };
                    for point in sum.data_points {
                        if let Some(number_data_point::Value::AsInt(v)) = point.value {
                            counters.insert((instance.clone(), m.name.clone()), v);
                        }
                    }
                }
            }
        }
        counters
    }

    /// The headers of every request received so far.
    pub fn request_headers(&self) -> Vec<HeaderMap> {
        let received = self.received.lock().unwrap();
        let all = received.traces.iter().chain(&received.metrics);
        all.map(|(h, _)| h.clone()).collect()
    }
}

fn attributes(list: &[KeyValue]) -> HashMap<String, Value> {
    list.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => Value::Str(s.clone()),
                Some(any_value::Value::IntValue(i)) => Value::Int(*i),
                _ => Value::Other,
            };
            (kv.key.clone(), value)
        })
        .collect()
}
