-- outboxd schema for SQLite, version 2: the name a worker is shown by
-- (PostgreSQL's version 14).
--
-- `worker.name` when configured, `host:pid` otherwise; the same name in the
-- worker's log lines, `outboxd status` and the dashboard. NULL for a row a
-- worker older than this version wrote: shown as hostname:pid.
ALTER TABLE {workers} ADD COLUMN name TEXT;
