-- no-transaction
-- outboxd schema, version 9: message_id unique among unpublished messages.
--
-- What a producer inserting its own ids can collide with; consumers
-- de-duplicate on message_id either way. Built without blocking producers
-- (CONCURRENTLY, so outside a transaction and alone in its file); version 10
-- then drops the unique constraint over every message ever sent, whose
-- index took a new entry (a random UUID) at every recorded publish: a
-- quarter of the record's index work (BENCHMARKS.md).
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {outbox}_message_id_pending_key
    ON {outbox} (message_id) WHERE published_at IS NULL;
