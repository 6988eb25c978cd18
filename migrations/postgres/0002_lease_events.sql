-- outboxd schema, version 2: a record of every lease change, so a rebalance
-- can be seen afterwards (who, which bucket, old/new owner and epoch, why).
-- Written in the same statement as the change itself.

CREATE TABLE {outbox}_lease_events (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at            timestamptz NOT NULL DEFAULT now(),
    partition_key text        NOT NULL,
    action        text        NOT NULL CHECK (action IN ('acquire', 'release')),
    worker_id     uuid        NOT NULL,
    old_owner     uuid,
    old_epoch     bigint      NOT NULL,
    new_epoch     bigint      NOT NULL,
    reason        text        NOT NULL
);

CREATE INDEX {outbox}_lease_events_at_idx ON {outbox}_lease_events (at);

-- Live membership, asked for on every coordination cycle.
CREATE INDEX {workers}_live_idx ON {workers} (heartbeat_until);
