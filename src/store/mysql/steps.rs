//! MySQL/MariaDB's statements for the flows of [`crate::store::stepwise`]:
//! lists as one JSON argument read by `JSON_TABLE`, joined first
//! (`STRAIGHT_JOIN`) so each listed row is found, and locked, by its
//! primary key — never a scan that would lock the rows around it. The
//! list's text columns are ASCII with a binary collation, as the labels'
//! columns are, so the join can use their index.

use super::{MySqlBackend, VIEWS};
use crate::store::settings::Tables;
use crate::store::sql::Sql;
use crate::store::statements::{LeaseStepsSql, OperatorStepsSql, StepsSql};
use crate::store::stepwise::{Stepwise, Views};

/// The listed ids (one JSON argument), as rows `j.v`.
pub(crate) const IDS: &str = "JSON_TABLE(?, '$[*]' COLUMNS (v BIGINT PATH '$')) j";

/// The listed labels (one JSON argument), as rows `j.v`.
pub(crate) const LABELS: &str = "JSON_TABLE(?, '$[*]' COLUMNS (v VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PATH '$')) j";

/// The listed leases (one JSON argument of pairs), as rows `j.k`, `j.e`.
const HELD: &str = "JSON_TABLE(?, '$[*]' COLUMNS (
        k VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PATH '$[0]', e BIGINT PATH '$[1]')) j";

fn sql(t: &Tables, template: &str) -> Sql {
    let template = template
        .replace("{ids}", IDS)
        .replace("{labels}", LABELS)
        .replace("{held}", HELD);
    Sql::render(t, &template)
}

pub(crate) fn lease_steps(t: &Tables) -> LeaseStepsSql {
    LeaseStepsSql {
        // Rows another worker is changing right now are skipped: it is
        // someone else's move.
        acquirable: sql(
            t,
            "SELECT p.partition_key, p.lease_owner, p.lease_epoch
             FROM {labels} STRAIGHT_JOIN {partitions} p ON p.partition_key = j.v
             WHERE p.lease_owner IS NULL OR p.lease_until <= UTC_TIMESTAMP(6)
             ORDER BY p.partition_key FOR UPDATE SKIP LOCKED",
        ),
        acquire: sql(
            t,
            "UPDATE {labels} STRAIGHT_JOIN {partitions} p ON p.partition_key = j.v
             SET p.lease_owner = ?, p.lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
                 p.lease_epoch = p.lease_epoch + 1, p.updated_at = UTC_TIMESTAMP(6)",
        ),
        renew: sql(
            t,
            "UPDATE {held} STRAIGHT_JOIN {partitions} p
                 ON p.partition_key = j.k AND p.lease_epoch = j.e
             SET p.lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
                 p.updated_at = UTC_TIMESTAMP(6)
             WHERE p.lease_owner = ?",
        ),
        // The worker row is left-joined: without it the leases are renewed
        // alone. No transaction holds a worker row while it waits for a
        // bucket's (the workers' statements touch that table only), so
        // whichever this locks first, it cannot deadlock with them.
        renew_and_beat: Some(sql(
            t,
            "UPDATE {held} STRAIGHT_JOIN {partitions} p
                 ON p.partition_key = j.k AND p.lease_epoch = j.e
                 LEFT JOIN {workers} w ON w.worker_id = ?
             SET p.lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
                 p.updated_at = UTC_TIMESTAMP(6),
                 w.heartbeat_at = UTC_TIMESTAMP(6),
                 w.heartbeat_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
             WHERE p.lease_owner = ?",
        )),
        held: sql(
            t,
            "SELECT p.partition_key, p.lease_epoch
             FROM {held} STRAIGHT_JOIN {partitions} p
                 ON p.partition_key = j.k AND p.lease_epoch = j.e
             WHERE p.lease_owner = ?
             ORDER BY p.partition_key FOR UPDATE",
        ),
        owned: sql(
            t,
            "SELECT partition_key, lease_epoch FROM {partitions}
             WHERE lease_owner = ? ORDER BY partition_key FOR UPDATE",
        ),
        free: sql(
            t,
            "UPDATE {labels} STRAIGHT_JOIN {partitions} p ON p.partition_key = j.v
             SET p.lease_owner = NULL, p.lease_until = NULL, p.updated_at = UTC_TIMESTAMP(6)
             WHERE p.lease_owner = ?",
        ),
        log_events: sql(
            t,
            "INSERT INTO {outbox}_lease_events
                 (partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason)
             SELECT j.k, j.a, UNHEX(j.w), UNHEX(j.o), j.oe, j.ne, j.r
             FROM JSON_TABLE(?, '$[*]' COLUMNS (
                 n FOR ORDINALITY, k VARCHAR(64) PATH '$[0]', a VARCHAR(16) PATH '$[1]',
                 w CHAR(32) PATH '$[2]', o CHAR(32) PATH '$[3]', oe BIGINT PATH '$[4]',
                 ne BIGINT PATH '$[5]', r TEXT PATH '$[6]')) j
             ORDER BY j.n",
        ),
        at_once: None,
    }
}

pub(crate) fn operator_steps(t: &Tables) -> OperatorStepsSql {
    OperatorStepsSql {
        droppable: sql(
            t,
            "SELECT o.id, o.message_id, o.partition_key, o.message_key, o.exchange,
                    o.routing_key, o.attempts, o.last_error
             FROM {ids} STRAIGHT_JOIN {outbox} o ON o.id = j.v
             WHERE o.published_at IS NULL
               AND (o.failed_at IS NOT NULL
                    OR (o.attempts > 0 AND o.available_at > UTC_TIMESTAMP(6)))
             ORDER BY o.id FOR UPDATE",
        ),
        delete: sql(
            t,
            "DELETE o FROM {ids} STRAIGHT_JOIN {outbox} o ON o.id = j.v",
        ),
        requeueable: sql(
            t,
            "SELECT o.id, o.message_key, o.partition_key,
                    EXISTS (SELECT 1 FROM {partitions} p
                            WHERE p.partition_key = o.partition_key) AS known
             FROM {outbox} o
             WHERE o.failed_at IS NOT NULL AND o.published_at IS NULL
               AND (o.id IN (SELECT j.v FROM {ids}) OR o.partition_key IN (SELECT j.v FROM {labels})
                    OR ?)
             ORDER BY o.id FOR UPDATE",
        ),
        partition_count: sql(t, "SELECT partition_count FROM {outbox}_settings"),
        requeue: sql(
            t,
            "UPDATE {ids} STRAIGHT_JOIN {outbox} o ON o.id = j.v
             SET o.failed_at = NULL, o.attempts = 0, o.available_at = UTC_TIMESTAMP(6),
                 o.claim_token = NULL, o.claimed_until = NULL,
                 o.partition_key = COALESCE(?, o.partition_key)",
        ),
        audit: sql(
            t,
            "INSERT INTO {outbox}_audit (actor, action, detail) VALUES (?, ?, ?)",
        ),
        blocked_heads: sql(
            t,
            "SELECT o.id, o.message_id, o.partition_key, o.message_key, o.exchange,
                    o.routing_key, o.attempts, o.last_error
             FROM {ids} STRAIGHT_JOIN {outbox} o ON o.id = j.v
             WHERE o.failed_at IS NULL AND o.published_at IS NULL
               AND o.attempts > 0 AND o.available_at > UTC_TIMESTAMP(6)
             ORDER BY o.id FOR UPDATE",
        ),
        park: sql(
            t,
            "UPDATE {ids} STRAIGHT_JOIN {outbox} o ON o.id = j.v
             SET o.failed_at = UTC_TIMESTAMP(6)",
        ),
        retry: sql(
            t,
            "UPDATE {ids} STRAIGHT_JOIN {outbox} o ON o.id = j.v
             SET o.available_at = UTC_TIMESTAMP(6)",
        ),
        wake: None,
    }
}

impl Stepwise for MySqlBackend {
    fn steps(&self) -> &StepsSql {
        &self.steps
    }

    fn views(&self) -> Views<'_> {
        Views {
            tables: &self.tables,
            dialect: VIEWS,
            overview_lines: &self.partitions.overview_lines,
        }
    }
}
