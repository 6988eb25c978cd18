-- outboxd schema, version 8: a claim is recorded once per bucket.
--
-- The drainer of a bucket writes its claim token and the claim's expiry on
-- the bucket's row in {partitions}, instead of on every claimed row, and
-- every later write of that drainer (recording a publish or a failure)
-- checks the token in the same statement as the lease fence. The claim no
-- longer writes into the outbox at all, so a published message costs one
-- row update (the record) instead of two (BENCHMARKS.md, "Less database
-- work per message"). The per-row claim_token and claimed_until columns are
-- no longer written; they stay (NULL from now on) so that queries and tools
-- reading them keep working.

-- Rows claimed by a worker of an earlier version are handed back (first:
-- this may scan the table, and must not hold the lock on {partitions}
-- below meanwhile).
UPDATE {outbox} SET claim_token = NULL, claimed_until = NULL
WHERE claim_token IS NOT NULL AND published_at IS NULL;

ALTER TABLE {partitions}
    ADD COLUMN claim_token   uuid,
    ADD COLUMN claimed_until timestamptz;
