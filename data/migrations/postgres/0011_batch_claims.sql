-- PostgreSQL's variant of 0011_batch_claims.sql (the same column).
ALTER TABLE batches ADD COLUMN gateway TEXT NOT NULL DEFAULT '';
