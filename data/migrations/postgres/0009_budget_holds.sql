-- PostgreSQL's variant of 0009_budget_holds.sql: the same columns and
-- tables, and the spend function of 0001_init.sql now also takes a final
-- row's tokens and cost out of the hold of the gateway that wrote it, in the
-- same transaction, so that spend plus holds never counts a request twice
-- nor loses it. A hold never goes below zero (a request admitted while its
-- tenant had no budget took no hold).
ALTER TABLE ledger ADD COLUMN gateway TEXT NOT NULL DEFAULT '';
CREATE TABLE gateways (
	id          TEXT   PRIMARY KEY,
	started_at  BIGINT NOT NULL,
	lease_until BIGINT NOT NULL
);
CREATE TABLE budget_holds (
	gateway   TEXT   NOT NULL,
	tenant_id BIGINT NOT NULL,
	tokens    BIGINT NOT NULL DEFAULT 0,
	micros    BIGINT NOT NULL DEFAULT 0,
	PRIMARY KEY (gateway, tenant_id)
);
CREATE OR REPLACE FUNCTION ledger_tenant_spend() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO tenant_spend (tenant_id, tokens, micros)
	VALUES (NEW.tenant_id, NEW.prompt_tokens + NEW.completion_tokens, NEW.cost_micros)
	ON CONFLICT (tenant_id) DO UPDATE SET
		tokens = tenant_spend.tokens + excluded.tokens,
		micros = tenant_spend.micros + excluded.micros;
	IF NEW.gateway <> '' THEN
		UPDATE budget_holds SET
			tokens = GREATEST(tokens - (NEW.prompt_tokens + NEW.completion_tokens), 0),
			micros = GREATEST(micros - NEW.cost_micros, 0)
		WHERE gateway = NEW.gateway AND tenant_id = NEW.tenant_id;
	END IF;
	RETURN NULL;
END
$$;
