//! The `<outbox>_throughput` and `<outbox>_throughput_seconds` tables:
//! published and failed attempts per minute and per second. Workers add
//! their counts once per tick to both (one statement); the dashboard reads
//! the last hour as 60 rows and the last five minutes as 300, never
//! counting the outbox table itself.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgExecutor;

use super::{Bounded, Sql, StoreError};
use crate::config::TablesConfig;

/// One minute of throughput.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Minute {
    pub minute: DateTime<Utc>,
    pub published: i64,
    pub failed: i64,
}

/// One second of throughput.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Second {
    pub second: DateTime<Utc>,
    pub published: i64,
    pub failed: i64,
}

/// The rendered statements of this module.
#[derive(Debug)]
pub struct StatsSql {
    record: Sql,
    last_hour: Sql,
    last_minutes: Sql,
    prune: Sql,
}

impl StatsSql {
    pub fn new(t: &TablesConfig) -> Self {
        Self {
            record: Sql::render(
                t,
                "WITH per_second AS (
                    INSERT INTO {outbox}_throughput_seconds AS t (second, published, failed)
                    VALUES (date_trunc('second', now()), $1, $2)
                    ON CONFLICT (second) DO UPDATE
                    SET published = t.published + excluded.published, failed = t.failed + excluded.failed
                 )
                 INSERT INTO {outbox}_throughput AS t (minute, published, failed)
                 VALUES (date_trunc('minute', now()), $1, $2)
                 ON CONFLICT (minute) DO UPDATE
                 SET published = t.published + excluded.published, failed = t.failed + excluded.failed",
            ),
            last_hour: Sql::render(
                t,
                "SELECT m AS minute, coalesce(t.published, 0) AS published, coalesce(t.failed, 0) AS failed
                 FROM generate_series(date_trunc('minute', now()) - interval '59 minutes',
                                      date_trunc('minute', now()), interval '1 minute') AS m
                 LEFT JOIN {outbox}_throughput t ON t.minute = m
                 ORDER BY m",
            ),
            last_minutes: Sql::render(
                t,
                "SELECT s AS second, coalesce(t.published, 0) AS published, coalesce(t.failed, 0) AS failed
                 FROM generate_series(date_trunc('second', now()) - interval '299 seconds',
                                      date_trunc('second', now()), interval '1 second') AS s
                 LEFT JOIN {outbox}_throughput_seconds t ON t.second = s
                 ORDER BY s",
            ),
            prune: Sql::render(
                t,
                "WITH seconds AS (
                    DELETE FROM {outbox}_throughput_seconds WHERE second < now() - interval '10 minutes'
                 )
                 DELETE FROM {outbox}_throughput WHERE minute < now() - interval '7 days'",
            ),
        }
    }

    /// Adds counts to the current minute.
    pub async fn record<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
        published: u64,
        failed: u64,
    ) -> Result<(), StoreError> {
        sqlx::query(self.record.q())
            .bind(published as i64)
            .bind(failed as i64)
            .execute(exec)
            .bounded("recording throughput")
            .await?;
        Ok(())
    }

    /// The last 60 minutes, oldest first, zeros included.
    pub async fn last_hour<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
    ) -> Result<Vec<Minute>, StoreError> {
        sqlx::query_as(self.last_hour.q())
            .fetch_all(exec)
            .bounded("reading throughput")
            .await
    }

    /// The last 300 seconds, oldest first, zeros included.
    pub async fn last_minutes<'e, E: PgExecutor<'e>>(
        &self,
        exec: E,
    ) -> Result<Vec<Second>, StoreError> {
        sqlx::query_as(self.last_minutes.q())
            .fetch_all(exec)
            .bounded("reading throughput")
            .await
    }

    /// Drops minutes older than a week and seconds older than ten minutes.
    pub async fn prune<'e, E: PgExecutor<'e>>(&self, exec: E) -> Result<u64, StoreError> {
        Ok(sqlx::query(self.prune.q())
            .execute(exec)
            .bounded("pruning throughput")
            .await?
            .rows_affected())
    }
}
