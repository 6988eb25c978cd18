//! Migrations and the recorded bucket count, written once over the driver
//! contract (`super::driver`) for every backend ([`SchemaStore`]). A
//! backend gives its embedded migrations and how they run on a session of
//! their own (`Driver::run_migrations`: sqlx's migrator holds a lock for
//! the length of its session), and its [`SchemaSql`].

use async_trait::async_trait;

use super::driver::{Arg, Driver, Statements};
use super::error::StoreError;
use super::schema::{MigrateReport, SchemaStore, migrations_table, partition_count_mismatch};
use super::settings::Tables;
use super::statements::SchemaSql;
use crate::partitioner::Partitioner;

/// The recorded bucket count, if there is one.
async fn recorded_count(
    on: &mut impl Statements,
    sql: &SchemaSql,
) -> Result<Option<u32>, StoreError> {
    let n: Vec<(i32,)> = on
        .fetch_all(&sql.count, &[], "reading partition_count")
        .await?;
    Ok(n.first().map(|&(n,)| n as u32))
}

#[async_trait]
impl<D: Driver> SchemaStore for D {
    fn tables(&self) -> &Tables {
        Driver::tables(self)
    }

    async fn migrate(&self, partitioner: Partitioner) -> Result<MigrateReport, StoreError> {
        let before = self.applied_versions().await?;
        let rebuilt = self.run_migrations().await?;
        let after = self.applied_versions().await?;
        let sql = &self.sql().schema;
        let count = partitioner.count();
        let mut tx = self.begin().await?;
        let args = [Arg::Int(i64::from(count))];
        let inserted = tx
            .execute(&sql.record_count, &args, "recording partition_count")
            .await?;
        let recorded = recorded_count(&mut tx, sql).await?.unwrap_or(count);
        if recorded != count {
            D::rollback(tx).await?;
            return Err(partition_count_mismatch(recorded, count));
        }
        let labels = partitioner.labels();
        tx.execute(
            &sql.ensure_rows,
            &[Arg::Labels(&labels)],
            "creating bucket rows",
        )
        .await?;
        D::commit(tx).await?;
        Ok(MigrateReport {
            applied: after.len().saturating_sub(before.len()),
            version: after.last().copied().unwrap_or(0),
            partition_count_recorded: inserted == 1,
            rebuilt,
        })
    }

    async fn applied_versions(&self) -> Result<Vec<i64>, StoreError> {
        let sql = &self.sql().schema;
        let table = migrations_table(Driver::tables(self));
        let args = [Arg::Text(Some(&table))];
        let exists: Vec<(i64,)> = self
            .reads()
            .fetch_all(
                &sql.has_migrations,
                &args,
                "looking for the migrations table",
            )
            .await?;
        if exists.first().is_none_or(|&(n,)| n == 0) {
            return Ok(Vec::new());
        }
        let versions: Vec<(i64,)> = self
            .reads()
            .fetch_all(&sql.applied, &[], "reading applied migrations")
            .await?;
        Ok(versions.into_iter().map(|(v,)| v).collect())
    }

    fn known_versions(&self) -> Vec<i64> {
        self.migrations().iter().map(|m| m.version).collect()
    }

    async fn partition_count(&self) -> Result<Option<u32>, StoreError> {
        recorded_count(&mut self.reads(), &self.sql().schema).await
    }
}
