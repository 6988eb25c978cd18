-- outboxd schema, version 11: producers' plain INSERTs get their bucket
-- from the database.
--
-- A producer in any language may now insert with plain SQL, naming only
-- message_key, exchange, routing_key and payload (optionally headers and
-- content_type): this trigger computes partition_key from the key under
-- the deployment's partition_count, the same way {outbox}_enqueue() does,
-- and wakes the bucket's worker (NOTIFY, delivered at commit). A row that
-- names its partition_key keeps it (parked visibly if it is not a bucket of
-- this deployment). The INSERT has taken its ROW EXCLUSIVE lock before the
-- trigger reads the count, so no row is labelled under an old count while
-- `outboxd repartition` holds the table (see version 5).
CREATE FUNCTION {outbox}_label_row() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NEW.partition_key IS NULL THEN
        IF NEW.message_key IS NULL THEN
            RAISE EXCEPTION '{outbox}: message_key must not be NULL'
                USING ERRCODE = 'not_null_violation';
        END IF;
        NEW.partition_key := {outbox}_partition_for(NEW.message_key);
        IF NEW.partition_key IS NULL THEN
            RAISE EXCEPTION '{outbox}_settings is empty; run outboxd migrate';
        END IF;
    END IF;
    PERFORM pg_notify('{outbox}_enqueued', NEW.partition_key);
    RETURN NEW;
END
$fn$;

CREATE TRIGGER {outbox}_label BEFORE INSERT ON {outbox}
    FOR EACH ROW EXECUTE FUNCTION {outbox}_label_row();
