-- PostgreSQL's variant of 0014_hold_stage.sql: hold_us in microseconds is a
-- BIGINT like the other stage columns.
ALTER TABLE ledger ADD COLUMN hold_us BIGINT;
