-- PostgreSQL's variant of 0010_attempt_log.sql (the same column).
ALTER TABLE ledger ADD COLUMN attempt_log TEXT;
