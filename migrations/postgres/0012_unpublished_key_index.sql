-- no-transaction
-- outboxd schema, version 12: the search by message key over unpublished
-- rows (pending and parked: what an operator looks for when something is
-- stuck), an index a recorded publish leaves alone. Built without blocking
-- producers (CONCURRENTLY, so outside a transaction and alone in its
-- file); version 13 then drops version 3's key index over every row, which
-- took a new entry at every recorded publish: about 5.5 us of PostgreSQL's
-- CPU per message, and what made a batch cost ~1.5 x more at a million
-- pending rows than at 10k (BENCHMARKS.md, fifth and sixth passes). README,
-- *Searching published messages by key*, puts it back for those who need it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {outbox}_unpublished_key_idx
    ON {outbox} (message_key, id) WHERE published_at IS NULL;
