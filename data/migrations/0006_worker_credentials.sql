-- Per-worker credentials: a worker's first registration (with the shared
-- cluster token) is given a secret that later heartbeats must present. Only
-- its SHA-256 is stored. The row names the replica id and address it was
-- issued for; a revoked row stays for the record.
CREATE TABLE worker_credentials (
	id         TEXT    PRIMARY KEY,
	replica_id TEXT    NOT NULL,
	address    TEXT    NOT NULL,
	peer       TEXT    NOT NULL DEFAULT '',
	hash       BLOB    NOT NULL UNIQUE,
	created_at INTEGER NOT NULL,
	revoked_at INTEGER
);
