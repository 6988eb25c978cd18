-- no-transaction
-- outboxd schema, version 13: version 3's key index over every row gives
-- way to version 12's over unpublished rows (dropped CONCURRENTLY, so
-- producers and workers are not blocked while it goes).
DROP INDEX CONCURRENTLY IF EXISTS {outbox}_message_key_idx;
