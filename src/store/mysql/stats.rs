//! MySQL/MariaDB: the throughput tables' statements (see
//! [`crate::store::stats`] for the flows that run them). Each tick's counts
//! go to the two tables in two statements.

use crate::store::settings::Tables;
use crate::store::sql::Sql;
use crate::store::statements::StatsSql;

/// The statements, in MySQL. `UTC_TIMESTAMP()` without a precision is
/// whole seconds.
pub fn statements(t: &Tables) -> StatsSql {
    StatsSql {
        record: vec![
            Sql::render(
                t,
                "INSERT INTO {outbox}_throughput_seconds (second, published, failed)
                 VALUES (UTC_TIMESTAMP(), ?, ?)
                 ON DUPLICATE KEY UPDATE published = published + VALUES(published),
                                         failed = failed + VALUES(failed)",
            ),
            Sql::render(
                t,
                "INSERT INTO {outbox}_throughput (minute, published, failed)
                 VALUES (UTC_TIMESTAMP() - INTERVAL SECOND(UTC_TIMESTAMP()) SECOND, ?, ?)
                 ON DUPLICATE KEY UPDATE published = published + VALUES(published),
                                         failed = failed + VALUES(failed)",
            ),
        ],
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
        prune: vec![
            Sql::render(
                t,
                "DELETE FROM {outbox}_throughput_seconds
                 WHERE second < UTC_TIMESTAMP(6) - INTERVAL 10 MINUTE",
            ),
            Sql::render(
                t,
                "DELETE FROM {outbox}_throughput WHERE minute < UTC_TIMESTAMP(6) - INTERVAL 7 DAY",
            ),
        ],
    }
}
