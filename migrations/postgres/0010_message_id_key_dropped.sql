-- outboxd schema, version 10: the unique constraint on message_id over
-- every row gives way to version 9's index over unpublished rows.
ALTER TABLE {outbox} DROP CONSTRAINT IF EXISTS {outbox}_message_id_key;
