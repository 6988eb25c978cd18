-- outboxd schema for MySQL/MariaDB (InnoDB, utf8mb4), version 1: the same
-- tables and meaning as the PostgreSQL schema (migrations/postgres) at its
-- version 11, in MySQL's terms.
--
-- Placeholders {outbox}, {partitions} and {workers} are replaced by the
-- configured table names before this runs (see src/store/mysql/schema.rs);
-- apply it with `outboxd migrate`. Never edit a migration after it has
-- landed: add a new one. Times are UTC (`UTC_TIMESTAMP(6)`), whatever the
-- session's time zone; UUIDs are BINARY(16).

-- Deployment-wide settings (a single row), written by `outboxd migrate`.
-- Every insert into {outbox} that leaves its bucket to the database reads
-- partition_count here with a shared lock, so `outboxd repartition`, which
-- locks this row for update, waits for producers in flight and holds new
-- ones until it commits.
CREATE TABLE {outbox}_settings (
    singleton       TINYINT     NOT NULL DEFAULT 1 PRIMARY KEY,
    partition_count INT         NOT NULL,
    created_at      DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    CONSTRAINT {outbox}_settings_singleton CHECK (singleton = 1),
    CONSTRAINT {outbox}_settings_count CHECK (partition_count BETWEEN 1 AND 1024)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Rows locked FOR UPDATE for the length of one transaction: 'registration'
-- serialises worker registrations and repartitioning, 'purge' lets one
-- process purge at a time. (MySQL's GET_LOCK belongs to a session.)
CREATE TABLE {outbox}_locks (
    name VARCHAR(32) NOT NULL PRIMARY KEY
) ENGINE = InnoDB DEFAULT CHARSET = ascii COLLATE = ascii_bin;
INSERT INTO {outbox}_locks (name) VALUES ('registration'), ('purge');

-- One row per message. Producers insert with plain SQL inside the
-- transaction that changes their business data, naming message_key,
-- exchange, routing_key and payload (optionally headers, content_type):
-- the trigger below computes partition_key; message_id and the times
-- default. `CALL {outbox}_enqueue(…)` does the same and returns the id.
CREATE TABLE {outbox} (
    id            BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    partition_key VARCHAR(8)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    message_key   VARCHAR(512) NOT NULL,
    exchange      VARCHAR(255) NOT NULL DEFAULT '',
    routing_key   VARCHAR(255) NOT NULL,
    message_id    BINARY(16)   NOT NULL DEFAULT (UNHEX(REPLACE(UUID(), '-', ''))),
    headers       JSON         NOT NULL DEFAULT ('{}'),
    content_type  VARCHAR(255),
    payload       LONGBLOB     NOT NULL,
    created_at    DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    available_at  DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    published_at  DATETIME(6),
    failed_at     DATETIME(6),
    attempts      INT          NOT NULL DEFAULT 0,
    last_error    TEXT,
    -- Not written: a claim is recorded on the bucket's row in {partitions}.
    claim_token   BINARY(16),
    claimed_until DATETIME(6),
    -- "The next unpublished rows of bucket b in id order" is one contiguous
    -- slice of this index (b, NULL, NULL, id…) whatever the table size.
    KEY {outbox}_pending_idx (partition_key, published_at, failed_at, id),
    -- Parked rows, for the Failed views and requeue.
    KEY {outbox}_failed_idx (failed_at),
    -- "Where is the message of order 42?": search by message key.
    KEY {outbox}_message_key_idx (message_key, id),
    UNIQUE KEY {outbox}_message_id_key (message_id),
    CONSTRAINT {outbox}_headers_object CHECK (JSON_TYPE(headers) = 'OBJECT'),
    CONSTRAINT {outbox}_partition_key_format CHECK (partition_key REGEXP '^p[0-9]{2,4}$')
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The bucket label of a message key: 'p' || crc32 % partition_count,
-- padded to the digits of partition_count, at least two — the same as the
-- Rust partitioner (MySQL's CRC32() is zlib's, the IEEE CRC-32) over the
-- key's UTF-8 bytes.
CREATE FUNCTION {outbox}_partition_for(p_key VARCHAR(512) CHARACTER SET utf8mb4)
RETURNS VARCHAR(8) CHARACTER SET ascii
READS SQL DATA
BEGIN
    DECLARE n INT;
    SELECT partition_count INTO n FROM {outbox}_settings;
    RETURN CONCAT('p', LPAD(CRC32(p_key) % n, GREATEST(2, LENGTH(n)), '0'));
END;

-- Labels a row whose producer left partition_key to the database, under
-- the deployment's partition_count, read with a shared lock (see
-- {outbox}_settings). A row that names its own label keeps it (and is
-- parked visibly if it is not a bucket of this deployment).
CREATE TRIGGER {outbox}_label BEFORE INSERT ON {outbox} FOR EACH ROW
BEGIN
    DECLARE n INT;
    IF NEW.message_key IS NULL THEN
        SIGNAL SQLSTATE '23000' SET MESSAGE_TEXT = '{outbox}: message_key must not be NULL';
    END IF;
    IF NEW.partition_key IS NULL OR NEW.partition_key = '' THEN
        SELECT partition_count INTO n FROM {outbox}_settings LOCK IN SHARE MODE;
        IF n IS NULL THEN
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{outbox}_settings is empty; run outboxd migrate';
        END IF;
        SET NEW.partition_key = CONCAT('p', LPAD(CRC32(NEW.message_key) % n, GREATEST(2, LENGTH(n)), '0'));
    END IF;
END;

-- Enqueue a message inside the caller's transaction; returns its id as a
-- one-row result (`CALL {outbox}_enqueue(key, exchange, routing_key,
-- payload, headers_or_NULL, content_type_or_NULL)`).
CREATE PROCEDURE {outbox}_enqueue(
    IN p_message_key  VARCHAR(512) CHARACTER SET utf8mb4,
    IN p_exchange     VARCHAR(255) CHARACTER SET utf8mb4,
    IN p_routing_key  VARCHAR(255) CHARACTER SET utf8mb4,
    IN p_payload      LONGBLOB,
    IN p_headers      LONGTEXT CHARACTER SET utf8mb4,
    IN p_content_type VARCHAR(255) CHARACTER SET utf8mb4
)
MODIFIES SQL DATA
BEGIN
    IF p_message_key IS NULL THEN
        SIGNAL SQLSTATE '23000' SET MESSAGE_TEXT = '{outbox}_enqueue: message_key must not be NULL';
    END IF;
    INSERT INTO {outbox} (message_key, exchange, routing_key, payload, headers, content_type)
    VALUES (p_message_key, COALESCE(p_exchange, ''), p_routing_key, p_payload,
            COALESCE(p_headers, '{}'), p_content_type);
    SELECT LAST_INSERT_ID() AS id;
END;

-- One row per bucket: who may publish it (fleet mode), and the claim of
-- the drainer that publishes it.
CREATE TABLE {partitions} (
    partition_key VARCHAR(8)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    lease_owner   BINARY(16),
    lease_until   DATETIME(6),
    lease_epoch   BIGINT      NOT NULL DEFAULT 0,
    updated_at    DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    claim_token   BINARY(16),
    claimed_until DATETIME(6)
) ENGINE = InnoDB;

-- Every lease change: who, which bucket, old/new owner and epoch, why.
CREATE TABLE {outbox}_lease_events (
    id            BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at            DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    partition_key VARCHAR(8)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    action        VARCHAR(16) NOT NULL,
    worker_id     BINARY(16)  NOT NULL,
    old_owner     BINARY(16),
    old_epoch     BIGINT      NOT NULL,
    new_epoch     BIGINT      NOT NULL,
    reason        TEXT        NOT NULL,
    KEY {outbox}_lease_events_at_idx (at),
    CONSTRAINT {outbox}_lease_events_action CHECK (action IN ('acquire', 'release'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per live worker.
CREATE TABLE {workers} (
    worker_id       BINARY(16)   NOT NULL PRIMARY KEY,
    hostname        VARCHAR(255) NOT NULL,
    pid             INT          NOT NULL,
    version         VARCHAR(64)  NOT NULL,
    mode            VARCHAR(16)  NOT NULL,
    started_at      DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    heartbeat_at    DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    heartbeat_until DATETIME(6)  NOT NULL,
    published_total BIGINT       NOT NULL DEFAULT 0,
    failed_total    BIGINT       NOT NULL DEFAULT 0,
    published_rate  DOUBLE       NOT NULL DEFAULT 0,
    can_publish     BOOLEAN      NOT NULL DEFAULT TRUE,
    broker_error    TEXT,
    broker_blocked  TEXT,
    KEY {workers}_live_idx (heartbeat_until),
    CONSTRAINT {workers}_mode CHECK (mode IN ('leasing', 'no-leasing'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Published and failed attempts per minute and per second, added to by
-- every worker once per tick; the dashboard reads the last hour and the
-- last five minutes.
CREATE TABLE {outbox}_throughput (
    minute    DATETIME(6) NOT NULL PRIMARY KEY,
    published BIGINT      NOT NULL DEFAULT 0,
    failed    BIGINT      NOT NULL DEFAULT 0
) ENGINE = InnoDB;

CREATE TABLE {outbox}_throughput_seconds (
    second    DATETIME(6) NOT NULL PRIMARY KEY,
    published BIGINT      NOT NULL DEFAULT 0,
    failed    BIGINT      NOT NULL DEFAULT 0
) ENGINE = InnoDB;

-- Operator actions (requeue, drop, repartition): who, when, what.
CREATE TABLE {outbox}_audit (
    id     BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at     DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    actor  VARCHAR(255) NOT NULL,
    action VARCHAR(32)  NOT NULL,
    detail JSON         NOT NULL DEFAULT ('{}')
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
