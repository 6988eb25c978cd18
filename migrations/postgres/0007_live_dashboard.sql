-- outboxd schema, version 7: what the dashboard shows live.
--
-- Published and failed attempts per second over the last minutes (workers
-- add their counts every tick, as for the per-minute table, and prune rows
-- older than ten minutes), and whether RabbitMQ blocked a worker's
-- connection (a resource alarm: the worker claims nothing until unblocked).
CREATE TABLE {outbox}_throughput_seconds (
    second    timestamptz PRIMARY KEY,
    published bigint      NOT NULL DEFAULT 0,
    failed    bigint      NOT NULL DEFAULT 0
);

ALTER TABLE {workers} ADD COLUMN broker_blocked text;
