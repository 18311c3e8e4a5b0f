-- Tenants own keys and a budget (0 = unlimited). Times are unix microseconds.
CREATE TABLE tenants (
	id            INTEGER PRIMARY KEY,
	name          TEXT    NOT NULL UNIQUE,
	budget_tokens INTEGER NOT NULL DEFAULT 0,
	budget_micros INTEGER NOT NULL DEFAULT 0,
	created_at    INTEGER NOT NULL
);

-- API keys: only the SHA-256 of the secret and a display prefix, never the secret.
-- models is a JSON array of model names; '' or '[]' means every model.
CREATE TABLE api_keys (
	id              TEXT    PRIMARY KEY,
	tenant_id       INTEGER NOT NULL REFERENCES tenants(id),
	prefix          TEXT    NOT NULL,
	hash            BLOB    NOT NULL UNIQUE,
	rpm             INTEGER NOT NULL DEFAULT 0,
	tpm             INTEGER NOT NULL DEFAULT 0,
	max_concurrency INTEGER NOT NULL DEFAULT 0,
	models          TEXT    NOT NULL DEFAULT '',
	created_at      INTEGER NOT NULL,
	revoked_at      INTEGER
);
CREATE INDEX api_keys_prefix ON api_keys (prefix);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id, created_at);

-- meta holds small counters; keys_version is bumped by every key or budget
-- change so that other processes can poll one row to invalidate caches.
CREATE TABLE meta (
	k TEXT PRIMARY KEY,
	v INTEGER NOT NULL
);
INSERT INTO meta (k, v) VALUES ('keys_version', 0);

-- One row per request. No foreign keys on purpose: a rejected request may
-- have no key or tenant (0 / ''), and a constraint failure must never wedge
-- the batched writer, which retries failed batches until they succeed.
-- Stage columns are microseconds; NULL means not measured.
CREATE TABLE ledger (
	id                    TEXT    PRIMARY KEY,
	ts                    INTEGER NOT NULL,
	tenant_id             INTEGER NOT NULL DEFAULT 0,
	key_id                TEXT    NOT NULL DEFAULT '',
	model                 TEXT    NOT NULL DEFAULT '',
	upstream              TEXT    NOT NULL DEFAULT '',
	stream                INTEGER NOT NULL DEFAULT 0,
	prompt_tokens         INTEGER NOT NULL DEFAULT 0,
	completion_tokens     INTEGER NOT NULL DEFAULT 0,
	hedge_overhead_tokens INTEGER NOT NULL DEFAULT 0,
	cost_micros           INTEGER NOT NULL DEFAULT 0,
	status                INTEGER NOT NULL DEFAULT 0,
	outcome               TEXT    NOT NULL DEFAULT '',
	error                 TEXT    NOT NULL DEFAULT '',
	attempts              INTEGER NOT NULL DEFAULT 0,
	hedged                INTEGER NOT NULL DEFAULT 0,
	gateway_us            INTEGER,
	connect_us            INTEGER,
	upstream_ttft_us      INTEGER,
	engine_queue_us       INTEGER,
	engine_ttft_us        INTEGER,
	network_us            INTEGER,
	ttft_us               INTEGER,
	total_us              INTEGER
);
CREATE INDEX ledger_ts ON ledger (ts);
CREATE INDEX ledger_tenant_ts ON ledger (tenant_id, ts);

-- tenant_spend is the running per-tenant total of the ledger, kept by a
-- trigger so budget checks never scan the ledger. The trigger fires only for
-- rows actually inserted, so INSERT OR IGNORE of a duplicate id is not
-- counted twice.
CREATE TABLE tenant_spend (
	tenant_id INTEGER PRIMARY KEY,
	tokens    INTEGER NOT NULL DEFAULT 0,
	micros    INTEGER NOT NULL DEFAULT 0
);
CREATE TRIGGER ledger_tenant_spend AFTER INSERT ON ledger
BEGIN
	INSERT INTO tenant_spend (tenant_id, tokens, micros)
	VALUES (NEW.tenant_id, NEW.prompt_tokens + NEW.completion_tokens, NEW.cost_micros)
	ON CONFLICT (tenant_id) DO UPDATE SET
		tokens = tokens + excluded.tokens,
		micros = micros + excluded.micros;
END;
