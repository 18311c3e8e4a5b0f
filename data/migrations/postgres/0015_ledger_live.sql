-- PostgreSQL's variant of 0015_ledger_live.sql: BIGINT figures, no WITHOUT
-- ROWID, the trigger as a function.
CREATE TABLE ledger_live (
	id TEXT PRIMARY KEY,
	prompt_tokens BIGINT NOT NULL,
	completion_tokens BIGINT NOT NULL,
	hedge_overhead_tokens BIGINT NOT NULL,
	cost_micros BIGINT NOT NULL
);
CREATE FUNCTION ledger_live_done() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	DELETE FROM ledger_live WHERE id = OLD.id;
	RETURN NULL;
END
$$;
CREATE TRIGGER ledger_live_done AFTER UPDATE ON ledger
	FOR EACH ROW WHEN (OLD.outcome = 'open')
	EXECUTE FUNCTION ledger_live_done();
