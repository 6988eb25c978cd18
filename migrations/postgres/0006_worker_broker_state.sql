-- outboxd schema, version 6: whether a worker can reach its broker.
--
-- A worker that has not reached RabbitMQ for worker.broker_grace sets
-- can_publish = false (with the reason in broker_error): it gives its leases
-- up, and every worker leaves it out of the target computation until it can
-- publish again. The dashboard and `outboxd status` show the state.
ALTER TABLE {workers}
    ADD COLUMN can_publish  boolean NOT NULL DEFAULT true,
    ADD COLUMN broker_error text;
