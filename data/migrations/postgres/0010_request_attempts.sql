-- PostgreSQL's variant of 0010_request_attempts.sql: the same table;
-- WITHOUT ROWID is SQLite's alone (a PostgreSQL table is a heap with its
-- primary key's index either way).
CREATE TABLE request_attempts (
	request_id        TEXT   NOT NULL,
	n                 BIGINT NOT NULL,
	replica           TEXT   NOT NULL,
	role              TEXT   NOT NULL,
	start_us          BIGINT NOT NULL,
	ttft_us           BIGINT,
	end_us            BIGINT,
	outcome           TEXT   NOT NULL,
	reason            TEXT   NOT NULL DEFAULT '',
	prompt_tokens     BIGINT NOT NULL DEFAULT 0,
	completion_tokens BIGINT NOT NULL DEFAULT 0,
	PRIMARY KEY (request_id, n)
);
