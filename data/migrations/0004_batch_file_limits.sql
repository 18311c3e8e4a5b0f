-- Batch files expire (OpenAI's expires_after) and count against their
-- tenant's storage quota. expires_at is unix microseconds, NULL for a file
-- that never expires; files stored before this migration expire 30 days
-- after they were created (OpenAI's default for batch files, and ours).
ALTER TABLE files ADD COLUMN expires_at INTEGER;
UPDATE files SET expires_at = created_at + 30 * 86400 * 1000000;
CREATE INDEX files_expires ON files (expires_at) WHERE expires_at IS NOT NULL;

-- The lifetime, in seconds, of a batch's output and error files
-- (output_expires_after); 0 means the gateway's default. A file that a
-- batch still reads cannot be deleted: input_file_id is looked up.
ALTER TABLE batches ADD COLUMN output_expires_after INTEGER NOT NULL DEFAULT 0;
CREATE INDEX batches_input_file ON batches (input_file_id);
