-- PostgreSQL's variant of 0005_batch_line_starts.sql.
CREATE TABLE batch_line_starts (
	batch_id TEXT   NOT NULL,
	line     BIGINT NOT NULL,
	starts   BIGINT NOT NULL,
	PRIMARY KEY (batch_id, line)
);
