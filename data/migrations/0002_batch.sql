-- The Batch API. File bodies live on disk (one file per id under the
-- gateway's files directory); this table says who owns them. Times are unix
-- microseconds.
CREATE TABLE files (
	id         TEXT    PRIMARY KEY,
	tenant_id  INTEGER NOT NULL,
	purpose    TEXT    NOT NULL,
	filename   TEXT    NOT NULL,
	bytes      INTEGER NOT NULL,
	created_at INTEGER NOT NULL
);
CREATE INDEX files_tenant ON files (tenant_id, created_at);

-- A batch runs the lines of its input file through the owner key's
-- principal. seq orders batches by creation for listing. metadata is a JSON
-- object and errors a JSON array ('' = none). Counters move in the same
-- transaction as the batch_lines row that causes them.
CREATE TABLE batches (
	seq               INTEGER PRIMARY KEY,
	id                TEXT    NOT NULL UNIQUE,
	tenant_id         INTEGER NOT NULL,
	key_id            TEXT    NOT NULL,
	endpoint          TEXT    NOT NULL,
	input_file_id     TEXT    NOT NULL,
	completion_window TEXT    NOT NULL,
	status            TEXT    NOT NULL,
	metadata          TEXT    NOT NULL DEFAULT '',
	errors            TEXT    NOT NULL DEFAULT '',
	output_file_id    TEXT    NOT NULL DEFAULT '',
	error_file_id     TEXT    NOT NULL DEFAULT '',
	total             INTEGER NOT NULL DEFAULT 0,
	completed         INTEGER NOT NULL DEFAULT 0,
	failed            INTEGER NOT NULL DEFAULT 0,
	prompt_tokens     INTEGER NOT NULL DEFAULT 0,
	completion_tokens INTEGER NOT NULL DEFAULT 0,
	created_at        INTEGER NOT NULL,
	expires_at        INTEGER NOT NULL,
	in_progress_at    INTEGER,
	finalizing_at     INTEGER,
	completed_at      INTEGER,
	failed_at         INTEGER,
	expired_at        INTEGER,
	cancelling_at     INTEGER,
	cancelled_at      INTEGER
);
CREATE INDEX batches_tenant ON batches (tenant_id, seq);
CREATE INDEX batches_status ON batches (status);

-- One row per finished line (a response of any status, or a line that could
-- not run): a restarted executor runs only the lines that have none. line is
-- the 0-based line number in the input file. body is the response body
-- (NULL when there was no response; error_code then says why).
CREATE TABLE batch_lines (
	batch_id      TEXT    NOT NULL REFERENCES batches (id),
	line          INTEGER NOT NULL,
	id            TEXT    NOT NULL,
	custom_id     TEXT    NOT NULL,
	ok            INTEGER NOT NULL,
	status_code   INTEGER NOT NULL DEFAULT 0,
	request_id    TEXT    NOT NULL DEFAULT '',
	body          BLOB,
	error_code    TEXT    NOT NULL DEFAULT '',
	error_message TEXT    NOT NULL DEFAULT '',
	finished_at   INTEGER NOT NULL,
	PRIMARY KEY (batch_id, line)
) WITHOUT ROWID;
