-- A stream gets an 'open' ledger row soon after its first token, updated as
-- it goes; its final row replaces it (an upsert that only ever overwrites an
-- open row), and rows still open at start-up are settled as 'interrupted'.
-- Spend counts a row once, when it stops being open: an open row is an
-- in-memory reservation's business until then, so a crash can neither bill a
-- stream twice nor bill it before it is settled.
DROP TRIGGER ledger_tenant_spend;
CREATE TRIGGER ledger_tenant_spend AFTER INSERT ON ledger
WHEN NEW.outcome <> 'open'
BEGIN
	INSERT INTO tenant_spend (tenant_id, tokens, micros)
	VALUES (NEW.tenant_id, NEW.prompt_tokens + NEW.completion_tokens, NEW.cost_micros)
	ON CONFLICT (tenant_id) DO UPDATE SET
		tokens = tokens + excluded.tokens,
		micros = micros + excluded.micros;
END;
CREATE TRIGGER ledger_tenant_spend_settle AFTER UPDATE OF outcome ON ledger
WHEN OLD.outcome = 'open' AND NEW.outcome <> 'open'
BEGIN
	INSERT INTO tenant_spend (tenant_id, tokens, micros)
	VALUES (NEW.tenant_id, NEW.prompt_tokens + NEW.completion_tokens, NEW.cost_micros)
	ON CONFLICT (tenant_id) DO UPDATE SET
		tokens = tokens + excluded.tokens,
		micros = micros + excluded.micros;
END;
-- Settling at start-up finds the open rows without scanning the ledger.
CREATE INDEX ledger_open ON ledger (id) WHERE outcome = 'open';
