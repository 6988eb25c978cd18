//! The throughput flows, written once over the driver contract
//! (`store::driver`) for every backend ([`StatsStore`]; the types are
//! [`super::stats`]'s): the last hour and minutes are the rows that exist
//! plus the database's clock, the gaps filled with zeros here (no backend
//! needs `generate_series`).

use async_trait::async_trait;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};

use super::bounds::bounded_op;
use super::driver::{Arg, Driver, Statements};
use super::error::StoreError;
use super::sql::Sql;
use super::stats::{Minute, Second, StatsStore};

/// `n` consecutive slots of `step` ending with the one holding `now`, with
/// the counts of `rows` (slot start, published, failed) where there are
/// any: what a backend without `generate_series` reads, zeros filled in.
pub(crate) fn zero_filled(
    now: DateTime<Utc>,
    step: TimeDelta,
    n: i32,
    rows: &[(DateTime<Utc>, i64, i64)],
) -> Vec<(DateTime<Utc>, i64, i64)> {
    let last = now.duration_trunc(step).unwrap_or(now);
    (0..n)
        .rev()
        .map(|back| {
            let at = last - step * back;
            rows.iter()
                .find(|(t, _, _)| *t == at)
                .map_or((at, 0, 0), |&(_, p, f)| (at, p, f))
        })
        .collect()
}

type Slot = (DateTime<Utc>, i64, i64);

/// The database's clock and the rows of one throughput table.
async fn slots<D: Driver>(d: &D, rows: &Sql) -> Result<(DateTime<Utc>, Vec<Slot>), StoreError> {
    let doing = "reading throughput";
    bounded_op(d.bounds(), doing, async {
        let now: Vec<(DateTime<Utc>,)> =
            d.reads().fetch_all(&d.sql().stats.now, &[], doing).await?;
        let now = now.first().map_or_else(Utc::now, |(t,)| *t);
        let rows = d.reads().fetch_all(rows, &[], doing).await?;
        Ok((now, rows))
    })
    .await
}

#[async_trait]
impl<D: Driver> StatsStore for D {
    async fn record_throughput(&self, published: u64, failed: u64) -> Result<(), StoreError> {
        let args = [Arg::Int(published as i64), Arg::Int(failed as i64)];
        for sql in &self.sql().stats.record {
            self.pool()
                .execute(sql, &args, "recording throughput")
                .await?;
        }
        Ok(())
    }

    async fn last_hour(&self) -> Result<Vec<Minute>, StoreError> {
        let (now, rows) = slots(self, &self.sql().stats.minutes).await?;
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
        let (now, rows) = slots(self, &self.sql().stats.seconds).await?;
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
        for sql in &self.sql().stats.prune {
            n += self.pool().execute(sql, &[], "pruning throughput").await?;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_end_with_the_current_one_and_fill_gaps_with_zeros() {
        let now = DateTime::parse_from_rfc3339("2026-11-22T10:15:42.5Z")
            .unwrap()
            .with_timezone(&Utc);
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        let rows = [
            (at("2026-11-22T10:14:00Z"), 7, 1),
            (at("2026-11-22T10:15:00Z"), 3, 0),
        ];
        let filled = zero_filled(now, TimeDelta::minutes(1), 3, &rows);
        assert_eq!(
            filled,
            vec![
                (at("2026-11-22T10:13:00Z"), 0, 0),
                (at("2026-11-22T10:14:00Z"), 7, 1),
                (at("2026-11-22T10:15:00Z"), 3, 0),
            ]
        );
    }
}
