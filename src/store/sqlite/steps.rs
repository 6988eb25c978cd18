//! SQLite's statements for the flows of [`crate::store::stepwise`]: lists
//! as one JSON argument (`json_each(?)`), read first in a `WITH` so they
//! stand first among the parameters. Every step runs in a `BEGIN
//! IMMEDIATE` transaction, which holds the file's only write lock: the
//! rows read are the rows written.

use super::{SqliteBackend, VIEWS, sql};
use crate::store::settings::Tables;
use crate::store::statements::{LeaseStepsSql, OperatorStepsSql, StepsSql};
use crate::store::stepwise::{Stepwise, Views};

/// The held leases of the first parameter, as rows `h(k, e)`.
const HELD: &str = "WITH h(k, e) AS (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?))";

/// The list of the first parameter, as rows `l(v)`.
const LIST: &str = "WITH l(v) AS (SELECT value FROM json_each(?))";

pub(crate) fn lease_steps(t: &Tables) -> LeaseStepsSql {
    LeaseStepsSql {
        acquirable: sql(
            t,
            "SELECT partition_key, lease_owner, lease_epoch FROM {partitions}
             WHERE partition_key IN (SELECT value FROM json_each(?))
               AND (lease_owner IS NULL OR lease_until <= {now})
             ORDER BY partition_key",
        ),
        acquire: sql(
            t,
            &format!(
                "{LIST} UPDATE {{partitions}}
                 SET lease_owner = ?, lease_until = {{now+?}}, lease_epoch = lease_epoch + 1,
                     updated_at = {{now}}
                 WHERE partition_key IN (SELECT v FROM l)"
            ),
        ),
        renew: sql(
            t,
            &format!(
                "{HELD} UPDATE {{partitions}} SET lease_until = {{now+?}}, updated_at = {{now}}
                 WHERE (partition_key, lease_epoch) IN (SELECT k, e FROM h) AND lease_owner = ?"
            ),
        ),
        renew_and_beat: None,
        held: sql(
            t,
            &format!(
                "{HELD} SELECT partition_key, lease_epoch FROM {{partitions}}
                 WHERE (partition_key, lease_epoch) IN (SELECT k, e FROM h) AND lease_owner = ?
                 ORDER BY partition_key"
            ),
        ),
        owned: sql(
            t,
            "SELECT partition_key, lease_epoch FROM {partitions}
             WHERE lease_owner = ? ORDER BY partition_key",
        ),
        free: sql(
            t,
            &format!(
                "{LIST} UPDATE {{partitions}}
                 SET lease_owner = NULL, lease_until = NULL, updated_at = {{now}}
                 WHERE partition_key IN (SELECT v FROM l) AND lease_owner = ?"
            ),
        ),
        log_events: sql(
            t,
            "INSERT INTO {outbox}_lease_events
                 (partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason)
             SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),
                    unhex(json_extract(value, '$[2]')), unhex(json_extract(value, '$[3]')),
                    json_extract(value, '$[4]'), json_extract(value, '$[5]'),
                    json_extract(value, '$[6]')
             FROM json_each(?) ORDER BY key",
        ),
        at_once: None,
    }
}

pub(crate) fn operator_steps(t: &Tables) -> OperatorStepsSql {
    OperatorStepsSql {
        droppable: sql(
            t,
            "SELECT id, message_id, partition_key, message_key, exchange, routing_key,
                    attempts, last_error
             FROM {outbox}
             WHERE id IN (SELECT value FROM json_each(?)) AND published_at IS NULL
               AND (failed_at IS NOT NULL OR (attempts > 0 AND available_at > {now}))
             ORDER BY id",
        ),
        delete: sql(
            t,
            "DELETE FROM {outbox} WHERE id IN (SELECT value FROM json_each(?))",
        ),
        requeueable: sql(
            t,
            "SELECT o.id, o.message_key, o.partition_key,
                    EXISTS (SELECT 1 FROM {partitions} p
                            WHERE p.partition_key = o.partition_key) AS known
             FROM {outbox} o
             WHERE o.failed_at IS NOT NULL AND o.published_at IS NULL
               AND (o.id IN (SELECT value FROM json_each(?))
                    OR o.partition_key IN (SELECT value FROM json_each(?)) OR ?)
             ORDER BY o.id",
        ),
        partition_count: sql(t, "SELECT partition_count FROM {outbox}_settings"),
        requeue: sql(
            t,
            &format!(
                "{LIST} UPDATE {{outbox}}
                 SET failed_at = NULL, attempts = 0, available_at = {{now}},
                     partition_key = COALESCE(?, partition_key)
                 WHERE id IN (SELECT v FROM l)"
            ),
        ),
        audit: sql(
            t,
            "INSERT INTO {outbox}_audit (actor, action, detail) VALUES (?, ?, ?)",
        ),
        blocked_heads: sql(
            t,
            "SELECT id, message_id, partition_key, message_key, exchange, routing_key,
                    attempts, last_error
             FROM {outbox}
             WHERE id IN (SELECT value FROM json_each(?))
               AND failed_at IS NULL AND published_at IS NULL
               AND attempts > 0 AND available_at > {now}
             ORDER BY id",
        ),
        park: sql(
            t,
            "UPDATE {outbox} SET failed_at = {now} WHERE id IN (SELECT value FROM json_each(?))",
        ),
        retry: sql(
            t,
            "UPDATE {outbox} SET available_at = {now} WHERE id IN (SELECT value FROM json_each(?))",
        ),
        wake: None,
    }
}

impl Stepwise for SqliteBackend {
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
