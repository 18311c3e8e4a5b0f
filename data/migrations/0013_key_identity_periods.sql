-- Keys get an identity beside their secret: a name (unique among a tenant's
-- active keys; '' for none), an owner and a note. last_used_at is the time
-- of the newest ledger row of the key, kept by the spend triggers below at
-- most once a minute per key (so the ledger writer updates a key's row at
-- most once a minute, and the request path never does). A rotated key
-- keeps its id, name and limits under a new secret; prev_hash is the old
-- secret's hash, accepted until prev_until (microseconds).
ALTER TABLE api_keys ADD COLUMN name TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN note TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN last_used_at INTEGER;
ALTER TABLE api_keys ADD COLUMN prev_hash BLOB;
ALTER TABLE api_keys ADD COLUMN prev_until INTEGER;
CREATE UNIQUE INDEX api_keys_tenant_name ON api_keys (tenant_id, name) WHERE name <> '' AND revoked_at IS NULL;
CREATE UNIQUE INDEX api_keys_prev_hash ON api_keys (prev_hash) WHERE prev_hash IS NOT NULL;

-- A tenant's budget may reset each calendar period in UTC: budget_period is
-- '' (a lifetime total, as before), 'daily', 'weekly' (weeks start on
-- Monday) or 'monthly'. budget_alert_percent is the soft threshold.
ALTER TABLE tenants ADD COLUMN budget_period TEXT NOT NULL DEFAULT '';
ALTER TABLE tenants ADD COLUMN budget_alert_percent INTEGER NOT NULL DEFAULT 80;
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

-- tenant_daily_spend is tenant_spend per UTC day (day = ts / 86400000000,
-- the row's own time): a period's spend is the sum of at most 31 rows,
-- whatever the ledger's size, and a request is counted in the period its
-- row's time falls in. key_spend is each key's running total. Both count a
-- row once, when it is final, as tenant_spend does.
CREATE TABLE tenant_daily_spend (
	tenant_id INTEGER NOT NULL,
	day       INTEGER NOT NULL,
	tokens    INTEGER NOT NULL DEFAULT 0,
	micros    INTEGER NOT NULL DEFAULT 0,
	requests  INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (tenant_id, day)
);
CREATE TABLE key_spend (
	key_id   TEXT    PRIMARY KEY,
	tokens   INTEGER NOT NULL DEFAULT 0,
	micros   INTEGER NOT NULL DEFAULT 0,
	requests INTEGER NOT NULL DEFAULT 0
);
CREATE TRIGGER ledger_period_spend AFTER INSERT ON ledger
WHEN NEW.outcome <> 'open'
BEGIN
	INSERT INTO tenant_daily_spend (tenant_id, day, tokens, micros, requests)
	VALUES (NEW.tenant_id, NEW.ts / 86400000000, NEW.prompt_tokens + NEW.completion_tokens, NEW.cost_micros,
		CASE WHEN NEW.outcome IN ('rejected', 'upstream_rejected') THEN 0 ELSE 1 END)
	ON CONFLICT (tenant_id, day) DO UPDATE SET
		tokens = tokens + excluded.tokens, micros = micros + excluded.micros, requests = requests + excluded.requests;
	INSERT INTO key_spend (key_id, tokens, micros, requests)
	SELECT NEW.key_id, NEW.prompt_tokens + NEW.completion_tokens, NEW.cost_micros,
		CASE WHEN NEW.outcome IN ('rejected', 'upstream_rejected') THEN 0 ELSE 1 END
	WHERE NEW.key_id <> ''
	ON CONFLICT (key_id) DO UPDATE SET
		tokens = tokens + excluded.tokens, micros = micros + excluded.micros, requests = requests + excluded.requests;
	UPDATE api_keys SET last_used_at = NEW.ts
	WHERE id = NEW.key_id AND COALESCE(last_used_at, 0) <= NEW.ts - 60000000;
END;
CREATE TRIGGER ledger_period_spend_settle AFTER UPDATE OF outcome ON ledger
WHEN OLD.outcome = 'open' AND NEW.outcome <> 'open'
BEGIN
	INSERT INTO tenant_daily_spend (tenant_id, day, tokens, micros, requests)
	VALUES (NEW.tenant_id, NEW.ts / 86400000000, NEW.prompt_tokens + NEW.completion_tokens, NEW.cost_micros,
		CASE WHEN NEW.outcome IN ('rejected', 'upstream_rejected') THEN 0 ELSE 1 END)
	ON CONFLICT (tenant_id, day) DO UPDATE SET
		tokens = tokens + excluded.tokens, micros = micros + excluded.micros, requests = requests + excluded.requests;
	INSERT INTO key_spend (key_id, tokens, micros, requests)
	SELECT NEW.key_id, NEW.prompt_tokens + NEW.completion_tokens, NEW.cost_micros,
		CASE WHEN NEW.outcome IN ('rejected', 'upstream_rejected') THEN 0 ELSE 1 END
	WHERE NEW.key_id <> ''
	ON CONFLICT (key_id) DO UPDATE SET
		tokens = tokens + excluded.tokens, micros = micros + excluded.micros, requests = requests + excluded.requests;
	UPDATE api_keys SET last_used_at = NEW.ts
	WHERE id = NEW.key_id AND COALESCE(last_used_at, 0) <= NEW.ts - 60000000;
END;

-- What the ledger holds already.
INSERT INTO tenant_daily_spend (tenant_id, day, tokens, micros, requests)
	SELECT tenant_id, ts / 86400000000, SUM(prompt_tokens + completion_tokens), SUM(cost_micros),
		SUM(CASE WHEN outcome IN ('rejected', 'upstream_rejected') THEN 0 ELSE 1 END)
	FROM ledger WHERE outcome <> 'open' GROUP BY tenant_id, ts / 86400000000;
INSERT INTO key_spend (key_id, tokens, micros, requests)
	SELECT key_id, SUM(prompt_tokens + completion_tokens), SUM(cost_micros),
		SUM(CASE WHEN outcome IN ('rejected', 'upstream_rejected') THEN 0 ELSE 1 END)
	FROM ledger WHERE outcome <> 'open' AND key_id <> '' GROUP BY key_id;
-- One pass over the ledger (it has no index on key_id).
UPDATE api_keys SET last_used_at = m.ts
	FROM (SELECT key_id, MAX(ts) AS ts FROM ledger WHERE key_id <> '' GROUP BY key_id) AS m
	WHERE m.key_id = api_keys.id;
