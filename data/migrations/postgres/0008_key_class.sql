-- PostgreSQL's variant of 0008_key_class.sql: queue_us in microseconds is a
-- BIGINT like the other stage columns.
ALTER TABLE api_keys ADD COLUMN class TEXT NOT NULL DEFAULT 'standard';
ALTER TABLE ledger ADD COLUMN priority TEXT NOT NULL DEFAULT '';
ALTER TABLE ledger ADD COLUMN queue_us BIGINT;
