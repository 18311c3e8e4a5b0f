-- Idempotency-Key records: one row per (tenant, key) a client sent with a
-- generating request, for the retention window (expires_at, microseconds).
-- fingerprint is the hex SHA-256 of what the request asked (the endpoint
-- and its body); request_id the request that ran it. state is 'pending'
-- while owner (the gateway process that runs it) runs it, 'done' once its
-- answer (status, content_type, body; a stream's events) is kept, or
-- 'unkept' for an answer larger than the bound on what is kept.
CREATE TABLE idempotency (
	tenant_id    BIGINT NOT NULL,
	idem_key     TEXT   NOT NULL,
	fingerprint  TEXT   NOT NULL,
	request_id   TEXT   NOT NULL,
	state        TEXT   NOT NULL,
	owner        TEXT   NOT NULL DEFAULT '',
	model        TEXT   NOT NULL DEFAULT '',
	stream       BIGINT NOT NULL DEFAULT 0,
	status       BIGINT NOT NULL DEFAULT 0,
	content_type TEXT   NOT NULL DEFAULT '',
	body         BLOB,
	created_at   BIGINT NOT NULL,
	expires_at   BIGINT NOT NULL,
	PRIMARY KEY (tenant_id, idem_key)
);
CREATE INDEX idempotency_expiry ON idempotency (expires_at);
CREATE INDEX idempotency_tenant_age ON idempotency (tenant_id, created_at);
-- replay_of: the request id whose answer this row's request was given
-- again (an Idempotency-Key replay, billed 0), or reran after a gateway
-- died running it; '' for every other row.
ALTER TABLE ledger ADD COLUMN replay_of TEXT NOT NULL DEFAULT '';
