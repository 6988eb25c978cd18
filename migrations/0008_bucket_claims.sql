-- outboxd schema, version 8: less database work per published message.
--
-- A claim is recorded once per bucket, on its row in {partitions}, instead
-- of on every claimed row: the drainer of a bucket writes its claim token
-- and the claim's expiry there, and every later write of that drainer
-- (recording a publish or a failure) checks the token in the same
-- statement as the lease fence. The claim itself no longer writes into the
-- outbox at all, so a published message costs one row update (the record)
-- instead of two. The per-row claim_token and claimed_until columns are no
-- longer written; they stay (always NULL from now on) so that queries and
-- tools reading them keep working.
ALTER TABLE {partitions}
    ADD COLUMN claim_token   uuid,
    ADD COLUMN claimed_until timestamptz;

-- Rows claimed by a worker of an earlier version are handed back.
UPDATE {outbox} SET claim_token = NULL, claimed_until = NULL
WHERE claim_token IS NOT NULL AND published_at IS NULL;

-- message_id stays unique among the messages not yet published (what a
-- producer inserting its own ids can collide with; a consumer de-duplicates
-- on it anyway), but recording a publish no longer adds an entry to a
-- unique index over every message ever sent: that entry, a random UUID, was
-- a quarter of the record's index work (BENCHMARKS.md, section 8).
ALTER TABLE {outbox} DROP CONSTRAINT {outbox}_message_id_key;
CREATE UNIQUE INDEX {outbox}_message_id_pending_key ON {outbox} (message_id)
    WHERE published_at IS NULL;
