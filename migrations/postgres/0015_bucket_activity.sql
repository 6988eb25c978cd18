-- outboxd schema, version 15: what each bucket published recently.
--
-- Each worker writes, with its heartbeat, the buckets it published from in
-- the last ten seconds and their rates (`p03=12.5 p07=0.4`), so that the
-- dashboard and `outboxd status` say a bucket is publishing from what it
-- did, not from one instant's pending count. NULL: nothing published (or a
-- worker older than this version).
ALTER TABLE {workers} ADD COLUMN bucket_activity text;
