-- outboxd schema, version 3: what the dashboard reads without scanning the
-- outbox table.

-- Published and failed attempts per minute, added to by every worker once
-- per tick; the dashboard's throughput chart reads the last 60 rows.
CREATE TABLE {outbox}_throughput (
    minute    timestamptz PRIMARY KEY,
    published bigint      NOT NULL DEFAULT 0,
    failed    bigint      NOT NULL DEFAULT 0
);

-- Each worker's totals and recent rate, written with its heartbeat.
ALTER TABLE {workers}
    ADD COLUMN published_total bigint           NOT NULL DEFAULT 0,
    ADD COLUMN failed_total    bigint           NOT NULL DEFAULT 0,
    ADD COLUMN published_rate  double precision NOT NULL DEFAULT 0;

-- "Where is the message of order 42?": search by message key.
CREATE INDEX {outbox}_message_key_idx ON {outbox} (message_key, id);

-- Operator actions (requeue, drop, …): who, when, what.
CREATE TABLE {outbox}_audit (
    id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at     timestamptz NOT NULL DEFAULT now(),
    actor  text        NOT NULL,
    action text        NOT NULL,
    detail jsonb       NOT NULL DEFAULT '{}'
);
