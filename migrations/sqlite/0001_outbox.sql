-- outboxd schema for SQLite, version 1: the same tables and meaning as the
-- PostgreSQL schema (migrations/postgres) at its version 13, in SQLite's
-- terms.
--
-- Placeholders {outbox}, {partitions} and {workers} are replaced by the
-- configured table names before this runs (see src/store/sqlite/schema.rs);
-- apply it with `outboxd migrate`. Never edit a migration after it has
-- landed: add a new one. Times are UTC text, 'YYYY-MM-DD HH:MM:SS.SSS'
-- (`strftime('%Y-%m-%d %H:%M:%f', 'now')`): one format everywhere, so
-- comparing the text compares the times. UUIDs are 16-byte blobs.

-- Deployment-wide settings (a single row), written by `outboxd migrate`.
-- SQLite has one writer at a time: `outboxd repartition` changes this row
-- and relabels rows in one write transaction, which no producer's insert
-- can interleave with.
CREATE TABLE {outbox}_settings (
    singleton       INTEGER NOT NULL DEFAULT 1 PRIMARY KEY CHECK (singleton = 1),
    partition_count INTEGER NOT NULL CHECK (partition_count BETWEEN 1 AND 1024),
    created_at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);

-- One row per message. Producers insert with plain SQL inside the
-- transaction that changes their business data, naming message_key,
-- exchange, routing_key and payload (optionally headers, content_type):
-- the trigger below computes partition_key; message_id and the times
-- default. `id` is AUTOINCREMENT: never reused, and — one writer at a
-- time — assigned in commit order.
CREATE TABLE {outbox} (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    partition_key TEXT,
    message_key   TEXT    NOT NULL,
    exchange      TEXT    NOT NULL DEFAULT '',
    routing_key   TEXT    NOT NULL,
    message_id    BLOB    NOT NULL UNIQUE DEFAULT (randomblob(16)),
    headers       TEXT    NOT NULL DEFAULT '{}',
    content_type  TEXT,
    payload       BLOB    NOT NULL,
    created_at    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    available_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    published_at  TEXT,
    failed_at     TEXT,
    attempts      INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT,
    CONSTRAINT {outbox}_headers_object CHECK (json_valid(headers) AND json_type(headers) = 'object'),
    CONSTRAINT {outbox}_partition_key_format CHECK (partition_key IS NULL
        OR (partition_key GLOB 'p[0-9][0-9]*' AND NOT partition_key GLOB 'p*[^0-9]*'
            AND length(partition_key) <= 5))
);

-- "The next unpublished rows of bucket b in id order" is one contiguous
-- slice of this partial index whatever the table size.
CREATE INDEX {outbox}_pending_idx ON {outbox} (partition_key, id)
    WHERE published_at IS NULL AND failed_at IS NULL;
-- Parked rows, for the Failed views and requeue.
CREATE INDEX {outbox}_failed_idx ON {outbox} (partition_key, id)
    WHERE failed_at IS NOT NULL;
-- Published rows, for the purge and the Published view.
CREATE INDEX {outbox}_published_idx ON {outbox} (published_at)
    WHERE published_at IS NOT NULL;
-- Rows not yet labeled: only those being inserted (see below), so the
-- label view reads one entry of this index, never the table.
CREATE INDEX {outbox}_unlabeled_idx ON {outbox} (id) WHERE partition_key IS NULL;
-- "Where is the message of order 42?": search by message key.
CREATE INDEX {outbox}_message_key_idx ON {outbox} (message_key, id);

-- The bucket label of every unlabeled row: 'p' || crc32(key) % n, padded
-- to the digits of partition_count, at least two — the same as the Rust
-- partitioner (IEEE CRC-32 over the key's UTF-8 bytes). SQLite has no
-- CRC32() and a trigger may call only built-in functions, so the CRC is
-- computed here in plain SQL, table-driven, a byte at a time over the
-- key's hex digits (xor is (a | b) - (a & b)); a trigger may not hold a
-- WITH clause, a view may. Only rows being inserted are unlabeled (see
-- the index above), so this reads one row.
CREATE TABLE {outbox}_crc32 (
    byte  INTEGER NOT NULL PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO {outbox}_crc32 (byte, value)
WITH RECURSIVE
    bytes(b) AS (SELECT 0 UNION ALL SELECT b + 1 FROM bytes WHERE b < 255),
    bits(b, k, v) AS (
        SELECT b, 0, b FROM bytes
        UNION ALL
        SELECT b, k + 1, CASE WHEN v & 1
            THEN ((v >> 1) | 3988292384) - ((v >> 1) & 3988292384)
            ELSE v >> 1 END
        FROM bits WHERE k < 8)
SELECT b, v FROM bits WHERE k = 8;

CREATE VIEW {outbox}_unlabeled AS
WITH RECURSIVE
    crc(id, h, n, i, c) AS (
        SELECT id, hex(CAST(message_key AS BLOB)), length(CAST(message_key AS BLOB)), 0, 4294967295
        FROM {outbox} WHERE partition_key IS NULL
        UNION ALL
        SELECT crc.id, crc.h, crc.n, crc.i + 1, (t.value | (crc.c >> 8)) - (t.value & (crc.c >> 8))
        FROM crc
        JOIN {outbox}_crc32 t ON t.byte =
            ((crc.c & 255) | (instr('0123456789ABCDEF', substr(crc.h, 2 * crc.i + 1, 1)) * 16 - 17
                              + instr('0123456789ABCDEF', substr(crc.h, 2 * crc.i + 2, 1))))
          - ((crc.c & 255) & (instr('0123456789ABCDEF', substr(crc.h, 2 * crc.i + 1, 1)) * 16 - 17
                              + instr('0123456789ABCDEF', substr(crc.h, 2 * crc.i + 2, 1))))
        WHERE crc.i < crc.n)
SELECT crc.id AS id,
       'p' || printf('%0' || max(2, length(s.partition_count)) || 'd',
                     (4294967295 - crc.c) % s.partition_count) AS label
FROM crc, {outbox}_settings s
WHERE crc.i = crc.n;

-- A NULL key is refused with a message that says so.
CREATE TRIGGER {outbox}_key_required BEFORE INSERT ON {outbox}
FOR EACH ROW WHEN NEW.message_key IS NULL
BEGIN
    SELECT RAISE(ABORT, '{outbox}: message_key must not be NULL');
END;

-- Labels a row whose producer left partition_key to the database, under
-- the deployment's partition_count. A row that names its own label keeps
-- it (and is parked visibly if it is not a bucket of this deployment).
CREATE TRIGGER {outbox}_label AFTER INSERT ON {outbox}
FOR EACH ROW WHEN NEW.partition_key IS NULL OR NEW.partition_key = ''
BEGIN
    SELECT RAISE(ABORT, '{outbox}_settings is empty; run outboxd migrate')
    WHERE NOT EXISTS (SELECT 1 FROM {outbox}_settings);
    UPDATE {outbox} SET partition_key = (SELECT label FROM {outbox}_unlabeled WHERE id = NEW.id)
    WHERE id = NEW.id;
END;

-- One row per bucket: who may publish it (fleet mode), and the claim of
-- the drainer that publishes it.
CREATE TABLE {partitions} (
    partition_key TEXT    NOT NULL PRIMARY KEY,
    lease_owner   BLOB,
    lease_until   TEXT,
    lease_epoch   INTEGER NOT NULL DEFAULT 0,
    updated_at    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    claim_token   BLOB,
    claimed_until TEXT
);

-- Every lease change: who, which bucket, old/new owner and epoch, why.
CREATE TABLE {outbox}_lease_events (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    at            TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    partition_key TEXT    NOT NULL,
    action        TEXT    NOT NULL CHECK (action IN ('acquire', 'release')),
    worker_id     BLOB    NOT NULL,
    old_owner     BLOB,
    old_epoch     INTEGER NOT NULL,
    new_epoch     INTEGER NOT NULL,
    reason        TEXT    NOT NULL
);
CREATE INDEX {outbox}_lease_events_at_idx ON {outbox}_lease_events (at);

-- One row per live worker.
CREATE TABLE {workers} (
    worker_id       BLOB    NOT NULL PRIMARY KEY,
    hostname        TEXT    NOT NULL,
    pid             INTEGER NOT NULL,
    version         TEXT    NOT NULL,
    mode            TEXT    NOT NULL CHECK (mode IN ('leasing', 'no-leasing')),
    started_at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    heartbeat_at    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    heartbeat_until TEXT    NOT NULL,
    published_total INTEGER NOT NULL DEFAULT 0,
    failed_total    INTEGER NOT NULL DEFAULT 0,
    published_rate  REAL    NOT NULL DEFAULT 0.0,
    can_publish     INTEGER NOT NULL DEFAULT 1,
    broker_error    TEXT,
    broker_blocked  TEXT
);

-- Published and failed attempts per minute and per second, added to by
-- every worker once per tick; the dashboard reads the last hour and the
-- last five minutes.
CREATE TABLE {outbox}_throughput (
    minute    TEXT    NOT NULL PRIMARY KEY,
    published INTEGER NOT NULL DEFAULT 0,
    failed    INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE {outbox}_throughput_seconds (
    second    TEXT    NOT NULL PRIMARY KEY,
    published INTEGER NOT NULL DEFAULT 0,
    failed    INTEGER NOT NULL DEFAULT 0
);

-- Operator actions (requeue, drop, repartition): who, when, what.
CREATE TABLE {outbox}_audit (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    at     TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    actor  TEXT    NOT NULL,
    action TEXT    NOT NULL,
    detail TEXT    NOT NULL DEFAULT '{}'
);
