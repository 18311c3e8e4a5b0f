-- PostgreSQL's variant of 0012_worker_admission.sql (BYTEA for BLOB).
CREATE TABLE worker_admissions (
	replica_id   TEXT   PRIMARY KEY,
	state        TEXT   NOT NULL,
	address      TEXT   NOT NULL DEFAULT '',
	peer         TEXT   NOT NULL DEFAULT '',
	requested_at BIGINT NOT NULL DEFAULT 0,
	updated_at   BIGINT NOT NULL
);

CREATE TABLE worker_invites (
	id         TEXT   PRIMARY KEY,
	replica_id TEXT   NOT NULL,
	hash       BYTEA  NOT NULL UNIQUE,
	created_at BIGINT NOT NULL,
	expires_at BIGINT NOT NULL,
	used_at    BIGINT,
	worker_id  TEXT   NOT NULL DEFAULT ''
);

-- Workers registered before this needed the token alone: an id with an
-- active credential stays admitted, one whose credentials are all revoked
-- stays out.
INSERT INTO worker_admissions (replica_id, state, updated_at)
	SELECT replica_id,
		CASE WHEN SUM(CASE WHEN revoked_at IS NULL THEN 1 ELSE 0 END) > 0 THEN 'approved' ELSE 'revoked' END,
		MAX(created_at)
	FROM worker_credentials GROUP BY replica_id;
