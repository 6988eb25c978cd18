//! PostgreSQL: the throughput tables' statements (see
//! [`crate::store::stats`] for the flows that run them). Each tick's counts
//! go to both tables in one statement.

use crate::store::settings::Tables;
use crate::store::sql::Sql;
use crate::store::statements::StatsSql;

/// The statements, in PostgreSQL.
pub fn statements(t: &Tables) -> StatsSql {
    StatsSql {
        record: vec![Sql::render(
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
        )],
        now: Sql::render(t, "SELECT now()"),
        minutes: Sql::render(
            t,
            "SELECT minute, published, failed FROM {outbox}_throughput
             WHERE minute > now() - interval '61 minutes' ORDER BY minute",
        ),
        seconds: Sql::render(
            t,
            "SELECT second, published, failed FROM {outbox}_throughput_seconds
             WHERE second > now() - interval '301 seconds' ORDER BY second",
        ),
        prune: vec![Sql::render(
            t,
            "WITH seconds AS (
                DELETE FROM {outbox}_throughput_seconds WHERE second < now() - interval '10 minutes'
             )
             DELETE FROM {outbox}_throughput WHERE minute < now() - interval '7 days'",
        )],
    }
}
