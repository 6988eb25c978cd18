-- outboxd schema, version 14: the name a worker is shown by.
--
-- `worker.name` when configured, `host:pid` otherwise; the same name in the
-- worker's log lines, `outboxd status` and the dashboard. NULL for a row a
-- worker older than this version wrote: shown as hostname:pid.
ALTER TABLE {workers} ADD COLUMN name text;
