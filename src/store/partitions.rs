//! The `outbox_partitions` table: one row per bucket.
//!
//! In fleet mode each row carries the bucket's lease (`lease_owner`,
//! `lease_until`, `lease_epoch`); the lease state machine that writes them
//! lives in the coordinator. This module only guarantees the rows exist.

use sqlx::PgExecutor;

use super::{QueryContext, StoreError, Tables, render};

/// Inserts a row for every bucket label that has none.
pub async fn ensure_rows<'e, E: PgExecutor<'e>>(
    exec: E,
    tables: &Tables,
    labels: &[String],
) -> Result<u64, StoreError> {
    Ok(sqlx::query(sqlx::AssertSqlSafe(render(
        &tables.names,
        "INSERT INTO {partitions} (partition_key) SELECT unnest($1::text[]) ON CONFLICT (partition_key) DO NOTHING",
    )))
    .bind(labels)
    .execute(exec)
    .await
    .doing("creating bucket rows")?
    .rows_affected())
}

/// Statements of this module (fleet-mode lease statements join here).
#[derive(Debug)]
pub struct PartitionsSql {}

impl PartitionsSql {
    pub fn new(_tables: &crate::config::TablesConfig) -> Self {
        Self {}
    }
}
