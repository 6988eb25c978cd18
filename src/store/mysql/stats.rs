//! MySQL/MariaDB: the throughput tables' statements (see
//! [`crate::store::stats`]). Without `generate_series`, the last hour and
//! minutes are read as the rows that exist plus the database's clock, and
//! the gaps filled with zeros here.

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};

use super::MySqlBackend;
use crate::config::TablesConfig;
use crate::store::stats::{Minute, Second, StatsStore, zero_filled};
use crate::store::{Bounded, QueryContext, Sql, StoreError, bounded_op};

/// The rendered statements of this module.
#[derive(Debug)]
pub struct StatsSql {
    record_second: Sql,
    record_minute: Sql,
    now: Sql,
    minutes: Sql,
    seconds: Sql,
    prune_seconds: Sql,
    prune_minutes: Sql,
}

impl StatsSql {
    pub fn new(t: &TablesConfig) -> Self {
        // UTC_TIMESTAMP() without a precision is whole seconds.
        Self {
            record_second: Sql::render(
                t,
                "INSERT INTO {outbox}_throughput_seconds (second, published, failed)
                 VALUES (UTC_TIMESTAMP(), ?, ?)
                 ON DUPLICATE KEY UPDATE published = published + VALUES(published),
                                         failed = failed + VALUES(failed)",
            ),
            record_minute: Sql::render(
                t,
                "INSERT INTO {outbox}_throughput (minute, published, failed)
                 VALUES (UTC_TIMESTAMP() - INTERVAL SECOND(UTC_TIMESTAMP()) SECOND, ?, ?)
                 ON DUPLICATE KEY UPDATE published = published + VALUES(published),
                                         failed = failed + VALUES(failed)",
            ),
            now: Sql::render(t, "SELECT UTC_TIMESTAMP(6)"),
            minutes: Sql::render(
                t,
                "SELECT minute, published, failed FROM {outbox}_throughput
                 WHERE minute > UTC_TIMESTAMP(6) - INTERVAL 61 MINUTE ORDER BY minute",
            ),
            seconds: Sql::render(
                t,
                "SELECT second, published, failed FROM {outbox}_throughput_seconds
                 WHERE second > UTC_TIMESTAMP(6) - INTERVAL 301 SECOND ORDER BY second",
            ),
            prune_seconds: Sql::render(
                t,
                "DELETE FROM {outbox}_throughput_seconds
                 WHERE second < UTC_TIMESTAMP(6) - INTERVAL 10 MINUTE",
            ),
            prune_minutes: Sql::render(
                t,
                "DELETE FROM {outbox}_throughput WHERE minute < UTC_TIMESTAMP(6) - INTERVAL 7 DAY",
            ),
        }
    }
}

impl MySqlBackend {
    /// The database's clock and the rows of one throughput table since a
    /// little over `n` slots ago.
    async fn slots(
        &self,
        rows: &Sql,
    ) -> Result<(DateTime<Utc>, Vec<(DateTime<Utc>, i64, i64)>), StoreError> {
        bounded_op("reading throughput", async {
            let now: DateTime<Utc> = sqlx::query_scalar(self.stats.now.q())
                .fetch_one(&self.pool)
                .await
                .doing("reading throughput")?;
            let rows = sqlx::query_as(rows.q())
                .fetch_all(&self.pool)
                .await
                .doing("reading throughput")?;
            Ok((now, rows))
        })
        .await
    }
}

#[async_trait]
impl StatsStore for MySqlBackend {
    async fn record_throughput(&self, published: u64, failed: u64) -> Result<(), StoreError> {
        for sql in [&self.stats.record_second, &self.stats.record_minute] {
            sqlx::query(sql.q())
                .bind(published as i64)
                .bind(failed as i64)
                .execute(&self.pool)
                .bounded("recording throughput")
                .await?;
        }
        Ok(())
    }

    async fn last_hour(&self) -> Result<Vec<Minute>, StoreError> {
        let (now, rows) = self.slots(&self.stats.minutes).await?;
        Ok(zero_filled(now, TimeDelta::minutes(1), 60, &rows)
            .into_iter()
            .map(|(minute, published, failed)| Minute {
                minute,
                published,
                failed,
            })
            .collect())
    }

    async fn last_minutes(&self) -> Result<Vec<Second>, StoreError> {
        let (now, rows) = self.slots(&self.stats.seconds).await?;
        Ok(zero_filled(now, TimeDelta::seconds(1), 300, &rows)
            .into_iter()
            .map(|(second, published, failed)| Second {
                second,
                published,
                failed,
            })
            .collect())
    }

    async fn prune_throughput(&self) -> Result<u64, StoreError> {
        let mut n = 0;
        for sql in [&self.stats.prune_seconds, &self.stats.prune_minutes] {
            n += sqlx::query(sql.q())
                .execute(&self.pool)
                .bounded("pruning throughput")
                .await?
                .rows_affected();
        }
        Ok(n)
    }
}
