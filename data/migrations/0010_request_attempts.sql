-- Every attempt of a request, not only the one that answered: the first,
-- its hedge, a retry; which replica each went to, when it started and
-- ended (microseconds after the request arrived), its time to first token,
-- how it ended (won, cancelled, failed) and why, and the tokens it cost.
-- Written with the request's final ledger row, in the same transaction; a
-- stream's open row has none. On SQLite the table is WITHOUT ROWID: its
-- primary key is the table, one B-tree to write per attempt instead of two
-- (migrations/postgres has the same table without that clause).
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
) WITHOUT ROWID;
