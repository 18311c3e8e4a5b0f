-- PostgreSQL's variant of 0013_key_identity_periods.sql: the same columns,
-- tables and backfill, BYTEA for BLOB, and the spend triggers as one
-- PL/pgSQL function. Rows of one batch are written in tenant order (see
-- tenantOrder), so two gateways' batches take these rows' locks in the same
-- order.
ALTER TABLE api_keys ADD COLUMN name TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN note TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN last_used_at BIGINT;
ALTER TABLE api_keys ADD COLUMN prev_hash BYTEA;
ALTER TABLE api_keys ADD COLUMN prev_until BIGINT;
CREATE UNIQUE INDEX api_keys_tenant_name ON api_keys (tenant_id, name) WHERE name <> '' AND revoked_at IS NULL;
CREATE UNIQUE INDEX api_keys_prev_hash ON api_keys (prev_hash) WHERE prev_hash IS NOT NULL;

ALTER TABLE tenants ADD COLUMN budget_period TEXT NOT NULL DEFAULT '';
ALTER TABLE tenants ADD COLUMN budget_alert_percent BIGINT NOT NULL DEFAULT 80;
-- budget_alerts records each threshold crossed, once per tenant, period
-- (its start, microseconds; 0 for a lifetime budget) and threshold, so that
-- gateways sharing the database send one alert between them.
CREATE TABLE budget_alerts (
	tenant_id    BIGINT NOT NULL,
	period_start BIGINT NOT NULL,
	threshold    BIGINT NOT NULL,
	sent_at      BIGINT NOT NULL,
	PRIMARY KEY (tenant_id, period_start, threshold)
);

CREATE TABLE tenant_daily_spend (
	tenant_id BIGINT NOT NULL,
	day       BIGINT NOT NULL,
	tokens    BIGINT NOT NULL DEFAULT 0,
	micros    BIGINT NOT NULL DEFAULT 0,
	requests  BIGINT NOT NULL DEFAULT 0,
	PRIMARY KEY (tenant_id, day)
);
CREATE TABLE key_spend (
	key_id   TEXT   PRIMARY KEY,
	tokens   BIGINT NOT NULL DEFAULT 0,
	micros   BIGINT NOT NULL DEFAULT 0,
	requests BIGINT NOT NULL DEFAULT 0
);
CREATE FUNCTION ledger_period_spend() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
	counted BIGINT := CASE WHEN NEW.outcome IN ('rejected', 'upstream_rejected') THEN 0 ELSE 1 END;
BEGIN
	INSERT INTO tenant_daily_spend (tenant_id, day, tokens, micros, requests)
	VALUES (NEW.tenant_id, NEW.ts / 86400000000, NEW.prompt_tokens + NEW.completion_tokens, NEW.cost_micros, counted)
	ON CONFLICT (tenant_id, day) DO UPDATE SET
		tokens = tenant_daily_spend.tokens + excluded.tokens,
		micros = tenant_daily_spend.micros + excluded.micros,
		requests = tenant_daily_spend.requests + excluded.requests;
	IF NEW.key_id <> '' THEN
		INSERT INTO key_spend (key_id, tokens, micros, requests)
		VALUES (NEW.key_id, NEW.prompt_tokens + NEW.completion_tokens, NEW.cost_micros, counted)
		ON CONFLICT (key_id) DO UPDATE SET
			tokens = key_spend.tokens + excluded.tokens,
			micros = key_spend.micros + excluded.micros,
			requests = key_spend.requests + excluded.requests;
		UPDATE api_keys SET last_used_at = NEW.ts
		WHERE id = NEW.key_id AND COALESCE(last_used_at, 0) <= NEW.ts - 60000000;
	END IF;
	RETURN NULL;
END
$$;
CREATE TRIGGER ledger_period_spend AFTER INSERT ON ledger
	FOR EACH ROW WHEN (NEW.outcome <> 'open')
	EXECUTE FUNCTION ledger_period_spend();
CREATE TRIGGER ledger_period_spend_settle AFTER UPDATE OF outcome ON ledger
	FOR EACH ROW WHEN (OLD.outcome = 'open' AND NEW.outcome <> 'open')
	EXECUTE FUNCTION ledger_period_spend();

-- What the ledger holds already.
INSERT INTO tenant_daily_spend (tenant_id, day, tokens, micros, requests)
	SELECT tenant_id, ts / 86400000000, SUM(prompt_tokens + completion_tokens)::BIGINT, SUM(cost_micros)::BIGINT,
		SUM(CASE WHEN outcome IN ('rejected', 'upstream_rejected') THEN 0 ELSE 1 END)::BIGINT
	FROM ledger WHERE outcome <> 'open' GROUP BY tenant_id, ts / 86400000000;
INSERT INTO key_spend (key_id, tokens, micros, requests)
	SELECT key_id, SUM(prompt_tokens + completion_tokens)::BIGINT, SUM(cost_micros)::BIGINT,
		SUM(CASE WHEN outcome IN ('rejected', 'upstream_rejected') THEN 0 ELSE 1 END)::BIGINT
	FROM ledger WHERE outcome <> 'open' AND key_id <> '' GROUP BY key_id;
-- One pass over the ledger (it has no index on key_id).
UPDATE api_keys SET last_used_at = m.ts
	FROM (SELECT key_id, MAX(ts) AS ts FROM ledger WHERE key_id <> '' GROUP BY key_id) AS m
	WHERE m.key_id = api_keys.id;
