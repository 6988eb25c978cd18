//! SQLite: the throughput tables' statements (see [`crate::store::stats`]
//! for the flows that run them). Each tick's counts go to the two tables
//! in two statements; a second or a minute is the text of its start.

use super::sql;
use crate::store::settings::Tables;
use crate::store::statements::StatsSql;

/// The statements, in SQLite.
pub fn statements(t: &Tables) -> StatsSql {
    StatsSql {
        record: vec![
            sql(
                t,
                "INSERT INTO {outbox}_throughput_seconds (second, published, failed)
                 VALUES (strftime('%Y-%m-%d %H:%M:%S.000', 'now'), ?1, ?2)
                 ON CONFLICT (second) DO UPDATE
                 SET published = published + excluded.published, failed = failed + excluded.failed",
            ),
            sql(
                t,
                "INSERT INTO {outbox}_throughput (minute, published, failed)
                 VALUES (strftime('%Y-%m-%d %H:%M:00.000', 'now'), ?1, ?2)
                 ON CONFLICT (minute) DO UPDATE
                 SET published = published + excluded.published, failed = failed + excluded.failed",
            ),
        ],
        now: sql(t, "SELECT {now}"),
        minutes: sql(
            t,
            "SELECT minute, published, failed FROM {outbox}_throughput
             WHERE minute > strftime('%Y-%m-%d %H:%M:%f', 'now', '-61 minutes') ORDER BY minute",
        ),
        seconds: sql(
            t,
            "SELECT second, published, failed FROM {outbox}_throughput_seconds
             WHERE second > strftime('%Y-%m-%d %H:%M:%f', 'now', '-301 seconds') ORDER BY second",
        ),
        prune: vec![
            sql(
                t,
                "DELETE FROM {outbox}_throughput_seconds
                 WHERE second < strftime('%Y-%m-%d %H:%M:%f', 'now', '-10 minutes')",
            ),
            sql(
                t,
                "DELETE FROM {outbox}_throughput
                 WHERE minute < strftime('%Y-%m-%d %H:%M:%f', 'now', '-7 days')",
            ),
        ],
    }
}
