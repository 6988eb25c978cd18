//! PostgreSQL: the throughput tables' statements (see
//! [`crate::store::stats`]). The last hour and minutes are read with
//! `generate_series`, zeros included.

use async_trait::async_trait;

use super::PgBackend;
use crate::config::TablesConfig;
use crate::store::stats::{Minute, Second, StatsStore};
use crate::store::{Bounded, Sql, StoreError};

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
}

#[async_trait]
impl StatsStore for PgBackend {
    async fn record_throughput(&self, published: u64, failed: u64) -> Result<(), StoreError> {
        sqlx::query(self.stats.record.q())
            .bind(published as i64)
            .bind(failed as i64)
            .execute(&self.pool)
            .bounded("recording throughput")
            .await?;
        Ok(())
    }

    async fn last_hour(&self) -> Result<Vec<Minute>, StoreError> {
        sqlx::query_as(self.stats.last_hour.q())
            .fetch_all(&self.pool)
            .bounded("reading throughput")
            .await
    }

    async fn last_minutes(&self) -> Result<Vec<Second>, StoreError> {
        sqlx::query_as(self.stats.last_minutes.q())
            .fetch_all(&self.pool)
            .bounded("reading throughput")
            .await
    }

    async fn prune_throughput(&self) -> Result<u64, StoreError> {
        Ok(sqlx::query(self.stats.prune.q())
            .execute(&self.pool)
            .bounded("pruning throughput")
            .await?
            .rows_affected())
    }
}
