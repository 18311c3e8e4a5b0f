-- PostgreSQL's variant of 0004_batch_file_limits.sql: BIGINT columns, and
-- the 30 days in microseconds computed in BIGINT (it overflows INTEGER).
ALTER TABLE files ADD COLUMN expires_at BIGINT;
UPDATE files SET expires_at = created_at + CAST(30 AS BIGINT) * 86400 * 1000000;
CREATE INDEX files_expires ON files (expires_at) WHERE expires_at IS NOT NULL;

ALTER TABLE batches ADD COLUMN output_expires_after BIGINT NOT NULL DEFAULT 0;
CREATE INDEX batches_input_file ON batches (input_file_id);
