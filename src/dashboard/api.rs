//! The JSON API under `<path>/api/`: the same data the pages show.
//!
//! | method and path | answer |
//! |---|---|
//! | `GET api/summary` | workers, buckets, last hour's throughput, totals, destinations (what the page polls) |
//! | `GET api/workers` | every worker row with heartbeat TTL, buckets held, totals, rate |
//! | `GET api/partitions` | every bucket: lease, pending/parked counts, lag, blocked head |
//! | `GET api/throughput` | published / failed per minute (last 60 minutes) and per second (last 5 minutes) |
//! | `GET api/messages?state=pending\|published\|failed&key=K&cursor=ID&limit=N` | a page of messages |
//! | `GET api/messages/{id}` | one message: headers, payload preview, attempts, last error |
//! | `GET api/lease-events?after=ID` or `?since_seconds=S` | lease changes, oldest first (after an event id, or of the last S seconds) |
//! | `POST api/requeue` `{"ids":[…]}` or `{"bucket":"p03"}` | requeue parked messages |
//! | `POST api/head` `{"id":N,"action":"retry"\|"park"\|"drop"}` | act on a blocked head (409 if it is not one waiting for its retry) |

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::destinations::DestinationView;
use super::error::ApiError;
use super::{DashboardState, auth};
use crate::store::outbox::{MessageState, MessageSummary};
use crate::store::partitions::{BucketView, LeaseEvent};
use crate::store::stats::{Minute, Second};
use crate::store::workers::WorkerView;
use crate::store::{HeadAction, Store, StoreError};

/// Pending and parked counts per bucket stop at this number ("10000+").
pub const COUNT_CAP: i64 = 10_000;
const MAX_PAGE: i64 = 200;
const PREVIEW_BYTES: usize = 4096;

#[derive(Serialize)]
pub struct Throughput {
    pub minutes: Vec<Minute>,
    pub published_last_hour: i64,
    pub failed_last_hour: i64,
    /// Published in the last complete minute (of the clock).
    pub current_per_minute: i64,
    /// Published in the last 60 complete seconds (the dashboard's
    /// "Last 60 s": never 0 while "Publishing now" is above 0).
    pub published_last_60s: i64,
    /// The last 300 seconds, oldest first.
    pub seconds: Vec<Second>,
    /// Published per second over the last 10 complete seconds.
    pub per_second_now: f64,
}

#[derive(Serialize)]
pub struct Totals {
    pub workers_live: usize,
    pub buckets: usize,
    pub buckets_owned: usize,
    pub pending: i64,
    pub pending_capped: bool,
    pub parked: i64,
    pub blocked_buckets: usize,
    pub max_lag_seconds: f64,
}

#[derive(Serialize)]
pub struct Summary {
    pub now: DateTime<Utc>,
    pub partition_count: u32,
    pub workers: Vec<WorkerView>,
    pub partitions: Vec<BucketView>,
    pub throughput: Throughput,
    pub totals: Totals,
    /// What the live workers delivered where.
    pub destinations: Vec<DestinationView>,
}

pub async fn summary(State(st): State<Arc<DashboardState>>) -> Result<Json<Summary>, ApiError> {
    Ok(Json(load_summary(&st.store, st.partition_count).await?))
}

/// Everything the page shows at once (also what `outboxd status` prints).
pub async fn load_summary(store: &Store, partition_count: u32) -> Result<Summary, StoreError> {
    let (mut workers, mut partitions, throughput) = tokio::try_join!(
        store.list_workers(),
        store.overview(COUNT_CAP),
        throughput_of(store),
    )?;
    let now = Utc::now();
    super::states::annotate(&mut workers, &mut partitions);
    let totals = Totals {
        workers_live: workers.iter().filter(|w| w.live).count(),
        buckets: partitions.len(),
        buckets_owned: partitions
            .iter()
            .filter(|p| p.lease_owner.is_some() && p.lease_ttl_seconds.is_some_and(|t| t > 0.0))
            .count(),
        pending: partitions.iter().map(|p| p.pending).sum(),
        pending_capped: partitions.iter().any(|p| p.pending_capped),
        parked: partitions.iter().map(|p| p.parked).sum(),
        blocked_buckets: partitions.iter().filter(|p| p.head_error.is_some()).count(),
        max_lag_seconds: partitions.iter().map(|p| p.lag_seconds).fold(0.0, f64::max),
    };
    Ok(Summary {
        now,
        partition_count,
        destinations: super::destinations::fleet(&workers),
        workers,
        partitions,
        throughput,
        totals,
    })
}

async fn throughput_of(store: &Store) -> Result<Throughput, StoreError> {
    let (minutes, seconds) = tokio::try_join!(store.last_hour(), store.last_minutes(),)?;
    let current_per_minute = minutes.iter().rev().nth(1).map_or(0, |m| m.published);
    // The current second is still being counted: the ones before it.
    let before_now = |n| {
        seconds
            .iter()
            .rev()
            .skip(1)
            .take(n)
            .map(|s| s.published)
            .sum::<i64>()
    };
    let recent = before_now(10);
    Ok(Throughput {
        published_last_60s: before_now(60),
        published_last_hour: minutes.iter().map(|m| m.published).sum(),
        failed_last_hour: minutes.iter().map(|m| m.failed).sum(),
        current_per_minute,
        per_second_now: recent as f64 / 10.0,
        minutes,
        seconds,
    })
}

pub async fn workers(
    State(st): State<Arc<DashboardState>>,
) -> Result<Json<Vec<WorkerView>>, ApiError> {
    Ok(Json(st.store.list_workers().await?))
}

pub async fn partitions(
    State(st): State<Arc<DashboardState>>,
) -> Result<Json<Vec<BucketView>>, ApiError> {
    Ok(Json(st.store.overview(COUNT_CAP).await?))
}

pub async fn throughput(
    State(st): State<Arc<DashboardState>>,
) -> Result<Json<Throughput>, ApiError> {
    Ok(Json(throughput_of(&st.store).await?))
}

#[derive(Deserialize)]
pub struct MessagesQuery {
    pub state: Option<MessageState>,
    /// A message key, or `#<id>` / a number to find one message by id.
    pub key: Option<String>,
    pub cursor: Option<i64>,
    pub limit: Option<i64>,
}

#[derive(Serialize)]
pub struct MessagesPage {
    pub state: MessageState,
    pub messages: Vec<MessageSummary>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<i64>,
    /// `outbox.keep_published`: false when published rows are deleted
    /// (the Published view then stays empty, and says why).
    pub keep_published: bool,
}

pub async fn messages(
    State(st): State<Arc<DashboardState>>,
    Query(q): Query<MessagesQuery>,
) -> Result<Json<MessagesPage>, ApiError> {
    let state = q.state.unwrap_or(MessageState::Pending);
    let limit = q.limit.unwrap_or(50).clamp(1, MAX_PAGE);
    let key = q.key.as_deref().map(str::trim).filter(|k| !k.is_empty());
    // A NUL cannot be in any key (PostgreSQL's text refuses it): bad input,
    // not a database outage.
    if key.is_some_and(|k| k.contains('\0')) {
        return Err(ApiError::BadRequest(
            "a key cannot contain a NUL character".into(),
        ));
    }
    // "#123" (or a bare number that is no key) finds a message by id.
    if let Some(id) = key
        .and_then(|k| k.strip_prefix('#'))
        .and_then(|k| k.parse::<i64>().ok())
    {
        let found = st.store.message_detail(id).await?;
        return Ok(Json(MessagesPage {
            state,
            messages: found.map(|d| d.summary).into_iter().collect(),
            next_cursor: None,
            keep_published: st.keep_published,
        }));
    }
    let messages = st.store.list_messages(state, key, q.cursor, limit).await?;
    let next_cursor = (messages.len() as i64 == limit)
        .then(|| messages.last().map(|m| m.id))
        .flatten();
    Ok(Json(MessagesPage {
        state,
        messages,
        next_cursor,
        keep_published: st.keep_published,
    }))
}

pub async fn message(
    State(st): State<Arc<DashboardState>>,
    Path(id): Path<i64>,
) -> Result<Json<Value>, ApiError> {
    let d = st
        .store
        .message_detail(id)
        .await?
        .ok_or(ApiError::NotFound)?;
    let shown = &d.payload[..d.payload.len().min(PREVIEW_BYTES)];
    let (encoding, preview) = match std::str::from_utf8(shown) {
        Ok(text) => ("utf-8", text.to_string()),
        // A cut in the middle of a character is still text.
        Err(e) if e.valid_up_to() + 4 > shown.len() => {
            ("utf-8", String::from_utf8_lossy(shown).into_owned())
        }
        Err(_) => ("hex", shown.iter().map(|b| format!("{b:02x}")).collect()),
    };
    let mut v = serde_json::to_value(&d.summary).expect("summary serialises");
    let obj = v.as_object_mut().expect("an object");
    obj.insert("headers".into(), d.headers.clone());
    obj.insert("content_type".into(), json!(d.content_type));
    obj.insert(
        "payload_preview".into(),
        json!({ "encoding": encoding, "text": preview, "truncated": d.payload.len() > PREVIEW_BYTES }),
    );
    Ok(Json(v))
}

#[derive(Deserialize)]
pub struct EventsQuery {
    pub after: Option<i64>,
    pub since_seconds: Option<u32>,
}

pub async fn lease_events(
    State(st): State<Arc<DashboardState>>,
    Query(q): Query<EventsQuery>,
) -> Result<Json<Vec<LeaseEvent>>, ApiError> {
    let partitions = &st.store;
    let events = match q.since_seconds {
        Some(s) => {
            partitions
                .events_within(f64::from(s.min(3600)), 2000)
                .await?
        }
        None => partitions.events_since(q.after.unwrap_or(0), 500).await?,
    };
    Ok(Json(events))
}

#[derive(Deserialize)]
pub struct RequeueRequest {
    #[serde(default)]
    pub ids: Vec<i64>,
    pub bucket: Option<String>,
}

/// The credential the guard actually checked, not what else the request
/// carries (a Bearer request with any session-like cookie).
fn actor_of(caller: Option<axum::Extension<auth::Caller>>) -> String {
    caller
        .map(|axum::Extension(c)| c)
        .unwrap_or(auth::Caller::Anonymous)
        .actor()
        .to_string()
}

pub async fn requeue(
    State(st): State<Arc<DashboardState>>,
    caller: Option<axum::Extension<auth::Caller>>,
    Json(req): Json<RequeueRequest>,
) -> Result<Json<Value>, ApiError> {
    let buckets: Vec<String> = req.bucket.into_iter().collect();
    if req.ids.is_empty() && buckets.is_empty() {
        return Err(ApiError::BadRequest("give ids or a bucket".into()));
    }
    let actor = actor_of(caller);
    let requeued = st.store.requeue(&req.ids, &buckets, false, &actor).await?;
    tracing::info!(ids = ?requeued, buckets = ?buckets, actor, "requeued parked messages");
    Ok(Json(json!({ "requeued": requeued })))
}

/// What the page does to a blocked head.
#[derive(Deserialize)]
pub struct HeadRequest {
    pub id: i64,
    pub action: String,
}

/// Retries, parks or drops a blocked head — the same as `outboxd failed
/// retry|park|drop`, audited with the caller — while it waits for its
/// retry; 409 otherwise (it is being retried right now, or is no longer
/// a blocked head).
pub async fn head(
    State(st): State<Arc<DashboardState>>,
    caller: Option<axum::Extension<auth::Caller>>,
    Json(req): Json<HeadRequest>,
) -> Result<Json<Value>, ApiError> {
    let actor = actor_of(caller);
    let reason = "from the dashboard";
    let done = match req.action.as_str() {
        "retry" => {
            st.store
                .act_on_heads(&[req.id], HeadAction::Retry, &actor, reason)
                .await?
        }
        "park" => {
            st.store
                .act_on_heads(&[req.id], HeadAction::Park, &actor, reason)
                .await?
        }
        "drop" => st.store.drop_parked(&[req.id], &actor, reason).await?,
        other => {
            return Err(ApiError::BadRequest(format!(
                "action '{}' is none of retry, park, drop",
                other.escape_default()
            )));
        }
    };
    if done.is_empty() {
        return Err(ApiError::Conflict(format!(
            "message {} is not a blocked head waiting for its retry (it may be being retried right now)",
            req.id
        )));
    }
    tracing::info!(id = req.id, action = %req.action, actor, "acted on a blocked head");
    Ok(Json(json!({ "done": done, "action": req.action })))
}
