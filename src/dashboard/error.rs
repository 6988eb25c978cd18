//! API errors: a short message for the client, the cause in the log.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::store::StoreError;

/// An error answered to a dashboard client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("not found")]
    NotFound,
    #[error("{0}")]
    BadRequest(String),
    /// The request is fine but the row is not in the state it needs.
    #[error("{0}")]
    Conflict(String),
    #[error("{}", told(.0))]
    Store(#[from] StoreError),
}

/// What a client is told of a store error: a statement that ran out of
/// time says which and after how long (the Published view's search by key
/// is stopped on purpose); anything else only that the database is
/// unavailable (its cause, which may name hosts, goes to the log).
fn told(e: &StoreError) -> String {
    match e {
        StoreError::Timeout { .. } => e.to_string(),
        _ => "the database is unavailable".into(),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self {
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Store(e) => {
                tracing::warn!(error = %e, "dashboard request failed");
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        (
            status,
            Json(serde_json::json!({ "error": self.to_string() })),
        )
            .into_response()
    }
}
