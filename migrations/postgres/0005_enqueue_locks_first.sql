-- outboxd schema, version 5: {outbox}_enqueue() takes its lock on {outbox}
-- before it computes the bucket.
--
-- `outboxd repartition` changes partition_count while holding a lock on
-- {outbox} that conflicts with inserts. Before this version, an enqueue
-- could read the old count, then wait for that lock at its INSERT, and
-- insert a row labelled under the old count after the change (found by
-- tests/ops.rs::repartition_with_rows_pending…). Taking the ROW EXCLUSIVE
-- lock (the one the INSERT takes anyway) first means the bucket is computed
-- with a snapshot taken after any repartition has committed.
CREATE OR REPLACE FUNCTION {outbox}_enqueue(
    message_key  text,
    exchange     text,
    routing_key  text,
    payload      bytea,
    headers      jsonb DEFAULT '{}',
    content_type text  DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_partition text;
    v_id        bigint;
BEGIN
    IF {outbox}_enqueue.message_key IS NULL THEN
        RAISE EXCEPTION '{outbox}_enqueue: message_key must not be NULL';
    END IF;
    LOCK TABLE {outbox} IN ROW EXCLUSIVE MODE;
    v_partition := {outbox}_partition_for({outbox}_enqueue.message_key);
    IF v_partition IS NULL THEN
        RAISE EXCEPTION '{outbox}_enqueue: {outbox}_settings is empty; run outboxd migrate';
    END IF;
    INSERT INTO {outbox} (partition_key, message_key, exchange, routing_key, payload, headers, content_type)
    VALUES (v_partition,
            {outbox}_enqueue.message_key,
            coalesce({outbox}_enqueue.exchange, ''),
            {outbox}_enqueue.routing_key,
            {outbox}_enqueue.payload,
            coalesce({outbox}_enqueue.headers, '{}'),
            {outbox}_enqueue.content_type)
    RETURNING {outbox}.id INTO v_id;
    PERFORM pg_notify('{outbox}_enqueued', v_partition);
    RETURN v_id;
END
$fn$;
