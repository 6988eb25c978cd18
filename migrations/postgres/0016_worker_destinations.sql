-- outboxd schema, version 16: what each worker delivered where.
--
-- Each worker writes, with its heartbeat, the destinations it delivered to
-- (a queue, an exchange or a stream), how many rows since it started and at
-- what rate, as a JSON array, so that the dashboard and `outboxd status`
-- show the sink per destination. NULL: nothing delivered yet (or a worker
-- older than this version).
ALTER TABLE {workers} ADD COLUMN destinations text;
