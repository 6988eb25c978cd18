//! PostgreSQL's statements for the flows of [`crate::store::stepwise`]:
//! lists as one array (`= ANY($n)`), held leases as one JSON array of
//! (bucket, epoch) pairs; the rows to change read `FOR UPDATE` in label
//! or id order, so two transactions given the same rows queue rather than
//! deadlock; a lease change is one statement with its events
//! (`LeasesAtOnceSql`); an operator's change wakes the buckets it touched
//! (`pg_notify`, delivered at commit).

use super::PgBackend;
use crate::store::settings::Tables;
use crate::store::sql::Sql;
use crate::store::statements::{Dialect, LeaseStepsSql, LeasesAtOnceSql, OperatorStepsSql};
use crate::store::stepwise::{Stepwise, Views};

/// How PostgreSQL reads the outbox through an index: its partial indexes
/// serve the predicates as written.
pub(crate) const VIEWS: Dialect = Dialect {
    pending: "{outbox} o",
    parked: "{outbox} o",
};

/// The held leases (one JSON argument of pairs), as rows `h.k`, `h.e`.
const HELD: &str =
    "(SELECT e->>0 AS k, (e->>1)::bigint AS e FROM jsonb_array_elements({arg}::jsonb) e) h";

/// The lease duration of `$n` milliseconds from now.
fn until(n: usize) -> String {
    format!("now() + make_interval(secs => ${n}::float8 / 1000)")
}

fn sql(t: &Tables, template: &str) -> Sql {
    Sql::render(t, template)
}

pub(crate) fn lease_steps(t: &Tables) -> LeaseStepsSql {
    let held = HELD.replace("{arg}", "$1");
    LeaseStepsSql {
        // Rows another worker is changing right now are skipped: it is
        // someone else's move.
        acquirable: sql(
            t,
            "SELECT partition_key, lease_owner, lease_epoch FROM {partitions}
             WHERE partition_key = ANY($1::text[]) AND (lease_owner IS NULL OR lease_until <= now())
             ORDER BY partition_key FOR UPDATE SKIP LOCKED",
        ),
        acquire: sql(
            t,
            &format!(
                "UPDATE {{partitions}}
                 SET lease_owner = $2, lease_until = {}, lease_epoch = lease_epoch + 1,
                     updated_at = now()
                 WHERE partition_key = ANY($1::text[])",
                until(3)
            ),
        ),
        renew: sql(
            t,
            &format!(
                "UPDATE {{partitions}} p SET lease_until = {}, updated_at = now()
                 FROM {held}
                 WHERE p.partition_key = h.k AND p.lease_epoch = h.e AND p.lease_owner = $3",
                until(2)
            ),
        ),
        // One row a lease renewed and one for the worker row beaten: the
        // count of rows is what the flow reads.
        renew_and_beat: Some(sql(
            t,
            &format!(
                "WITH renewed AS (
                    UPDATE {{partitions}} p SET lease_until = {}, updated_at = now()
                    FROM {held}
                    WHERE p.partition_key = h.k AND p.lease_epoch = h.e AND p.lease_owner = $5
                    RETURNING 1
                 ), beat AS (
                    UPDATE {{workers}} SET heartbeat_at = now(), heartbeat_until = {}
                    WHERE worker_id = $2
                    RETURNING 1
                 )
                 SELECT 1 FROM renewed UNION ALL SELECT 1 FROM beat",
                until(3),
                until(4)
            ),
        )),
        held: sql(
            t,
            &format!(
                "SELECT p.partition_key, p.lease_epoch FROM {{partitions}} p
                 JOIN {held} ON p.partition_key = h.k AND p.lease_epoch = h.e
                 WHERE p.lease_owner = $2
                 ORDER BY p.partition_key FOR UPDATE OF p"
            ),
        ),
        owned: sql(
            t,
            "SELECT partition_key, lease_epoch FROM {partitions}
             WHERE lease_owner = $1 ORDER BY partition_key FOR UPDATE",
        ),
        free: sql(
            t,
            "UPDATE {partitions} SET lease_owner = NULL, lease_until = NULL, updated_at = now()
             WHERE partition_key = ANY($1::text[]) AND lease_owner = $2",
        ),
        log_events: sql(
            t,
            "INSERT INTO {outbox}_lease_events
                 (partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason)
             SELECT e->>0, e->>1, (e->>2)::uuid, (e->>3)::uuid, (e->>4)::bigint,
                    (e->>5)::bigint, e->>6
             FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS x(e, n) ORDER BY n",
        ),
        at_once: Some(leases_at_once(t)),
    }
}

/// Lease changes with their events, each one statement: the change's rows
/// read `FOR UPDATE` in label order, changed, and logged in one `WITH`.
fn leases_at_once(t: &Tables) -> LeasesAtOnceSql {
    let held = HELD.replace("{arg}", "$1");
    // The freed rows of `released`, logged: owner $2, reason $3.
    let log_released = "logged AS (
            INSERT INTO {outbox}_lease_events
                (partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason)
            SELECT partition_key, 'release', $2, $2, lease_epoch, lease_epoch, $3
            FROM released ORDER BY partition_key
         )
         SELECT partition_key FROM released ORDER BY partition_key";
    let free = "UPDATE {partitions} p SET lease_owner = NULL, lease_until = NULL,
                    updated_at = now()
                FROM freed f WHERE p.partition_key = f.partition_key
                RETURNING p.partition_key, p.lease_epoch";
    LeasesAtOnceSql {
        acquire: sql(
            t,
            &format!(
                "WITH candidates AS (
                    SELECT partition_key, lease_owner, lease_epoch FROM {{partitions}}
                    WHERE partition_key = ANY($1::text[])
                      AND (lease_owner IS NULL OR lease_until <= now())
                    ORDER BY partition_key FOR UPDATE SKIP LOCKED
                 ), acquired AS (
                    UPDATE {{partitions}} p
                    SET lease_owner = $2, lease_until = {}, lease_epoch = p.lease_epoch + 1,
                        updated_at = now()
                    FROM candidates c WHERE p.partition_key = c.partition_key
                    RETURNING p.partition_key, c.lease_owner AS old_owner,
                              c.lease_epoch AS old_epoch, p.lease_epoch AS new_epoch
                 ), logged AS (
                    INSERT INTO {{outbox}}_lease_events
                        (partition_key, action, worker_id, old_owner, old_epoch, new_epoch, reason)
                    SELECT partition_key, 'acquire', $2, old_owner, old_epoch, new_epoch,
                           CASE WHEN old_owner IS NULL THEN 'free: ' || $4
                                ELSE 'expired lease of ' || old_owner || ': ' || $4 END
                    FROM acquired ORDER BY partition_key
                 )
                 SELECT partition_key, new_epoch, old_owner IS NULL FROM acquired
                 ORDER BY partition_key",
                until(3)
            ),
        ),
        release: sql(
            t,
            &format!(
                "WITH freed AS (
                    SELECT p.partition_key FROM {{partitions}} p
                    JOIN {held} ON p.partition_key = h.k AND p.lease_epoch = h.e
                    WHERE p.lease_owner = $2
                    ORDER BY p.partition_key FOR UPDATE OF p
                 ), released AS ({free}), {log_released}"
            ),
        ),
        release_all: sql(
            t,
            &format!(
                "WITH freed AS (
                    SELECT partition_key FROM {{partitions}}
                    WHERE lease_owner = $1 ORDER BY partition_key FOR UPDATE
                 ), released AS ({free}), {}",
                log_released.replace("$2", "$1").replace("$3", "$2")
            ),
        ),
    }
}

/// The columns an operator's change records of each row.
const DROPPED: &str =
    "id, message_id, partition_key, message_key, exchange, routing_key, attempts, last_error";

pub(crate) fn operator_steps(t: &Tables) -> OperatorStepsSql {
    OperatorStepsSql {
        droppable: sql(
            t,
            &format!(
                "SELECT {DROPPED} FROM {{outbox}}
                 WHERE id = ANY($1::bigint[]) AND published_at IS NULL
                   AND (failed_at IS NOT NULL OR (attempts > 0 AND available_at > now()))
                 ORDER BY id FOR UPDATE"
            ),
        ),
        delete: sql(t, "DELETE FROM {outbox} WHERE id = ANY($1::bigint[])"),
        requeueable: sql(
            t,
            "SELECT o.id, o.message_key, o.partition_key,
                    EXISTS (SELECT 1 FROM {partitions} p
                            WHERE p.partition_key = o.partition_key) AS known
             FROM {outbox} o
             WHERE o.failed_at IS NOT NULL AND o.published_at IS NULL
               AND (o.id = ANY($1::bigint[]) OR o.partition_key = ANY($2::text[]) OR $3)
             ORDER BY o.id FOR UPDATE OF o",
        ),
        partition_count: sql(t, "SELECT partition_count FROM {outbox}_settings"),
        requeue: sql(
            t,
            "UPDATE {outbox}
             SET failed_at = NULL, attempts = 0, available_at = now(),
                 claim_token = NULL, claimed_until = NULL,
                 partition_key = COALESCE($2, partition_key)
             WHERE id = ANY($1::bigint[])",
        ),
        audit: sql(
            t,
            "INSERT INTO {outbox}_audit (actor, action, detail) VALUES ($1, $2, $3::jsonb)",
        ),
        blocked_heads: sql(
            t,
            &format!(
                "SELECT {DROPPED} FROM {{outbox}}
                 WHERE id = ANY($1::bigint[]) AND failed_at IS NULL AND published_at IS NULL
                   AND attempts > 0 AND available_at > now()
                 ORDER BY id FOR UPDATE"
            ),
        ),
        park: sql(
            t,
            "UPDATE {outbox} SET failed_at = now() WHERE id = ANY($1::bigint[])",
        ),
        retry: sql(
            t,
            "UPDATE {outbox} SET available_at = now() WHERE id = ANY($1::bigint[])",
        ),
        wake: Some(sql(
            t,
            "SELECT pg_notify('{outbox}_enqueued', b) FROM unnest($1::text[]) b",
        )),
    }
}

impl Stepwise for PgBackend {
    fn steps(&self) -> &crate::store::statements::StepsSql {
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
