-- PostgreSQL's variant of 0006_worker_credentials.sql.
CREATE TABLE worker_credentials (
	rowid      BIGINT GENERATED ALWAYS AS IDENTITY,
	id         TEXT   PRIMARY KEY,
	replica_id TEXT   NOT NULL,
	address    TEXT   NOT NULL,
	peer       TEXT   NOT NULL DEFAULT '',
	hash       BYTEA  NOT NULL UNIQUE,
	created_at BIGINT NOT NULL,
	revoked_at BIGINT
);
