-- PostgreSQL's variant of 0020_usage_events.sql: the triggers as a
-- function, and seq assigned apart from the ledger's transactions.
--
-- Gateways sharing the database commit ledger transactions concurrently,
-- so a number drawn when the row is written (a sequence, an identity) can
-- commit after a larger one: a reader that went past the larger would never
-- see it. Events are therefore written with no seq, and
-- Store.UsageEvents numbers the ones committed so far in one transaction
-- under an advisory lock (a single sequencer at a time, whichever gateway
-- runs it), from the largest seq committed: every seq a later step gives
-- is above every seq a reader could have seen.
ALTER TABLE ledger ADD COLUMN endpoint TEXT NOT NULL DEFAULT '';
CREATE TABLE usage_events (
	request_id        TEXT   NOT NULL,
	version           BIGINT NOT NULL,
	seq               BIGINT,
	-- written orders the events a step numbers: about the order they were
	-- written (an identity is drawn in write order, not commit order,
	-- which is why it is not the cursor).
	written           BIGINT GENERATED ALWAYS AS IDENTITY,
	ts                BIGINT NOT NULL,
	tenant_id         BIGINT NOT NULL,
	key_id            TEXT   NOT NULL,
	model             TEXT   NOT NULL,
	endpoint          TEXT   NOT NULL,
	prompt_tokens     BIGINT NOT NULL,
	completion_tokens BIGINT NOT NULL,
	cost_micros       BIGINT NOT NULL,
	status            BIGINT NOT NULL,
	outcome           TEXT   NOT NULL,
	replay_of         TEXT   NOT NULL DEFAULT '',
	PRIMARY KEY (request_id, version)
);
CREATE UNIQUE INDEX usage_events_seq ON usage_events (seq);
CREATE INDEX usage_events_pending ON usage_events (written) WHERE seq IS NULL;
CREATE FUNCTION ledger_usage_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO usage_events (request_id, version, ts, tenant_id, key_id, model, endpoint,
		prompt_tokens, completion_tokens, cost_micros, status, outcome, replay_of)
	VALUES (NEW.id, COALESCE((SELECT MAX(version) FROM usage_events WHERE request_id = NEW.id), 0) + 1,
		NEW.ts, NEW.tenant_id, NEW.key_id, NEW.model, NEW.endpoint,
		NEW.prompt_tokens, NEW.completion_tokens, NEW.cost_micros, NEW.status, NEW.outcome, NEW.replay_of);
	RETURN NULL;
END
$$;
CREATE TRIGGER ledger_usage_event AFTER INSERT ON ledger
	FOR EACH ROW WHEN (NEW.outcome <> 'open' AND NEW.tenant_id <> 0)
	EXECUTE FUNCTION ledger_usage_event();
CREATE TRIGGER ledger_usage_event_update AFTER UPDATE ON ledger
	FOR EACH ROW WHEN (NEW.outcome <> 'open' AND NEW.tenant_id <> 0 AND (OLD.outcome = 'open'
		OR (OLD.prompt_tokens, OLD.completion_tokens, OLD.cost_micros, OLD.status, OLD.outcome,
			OLD.tenant_id, OLD.key_id, OLD.model)
		IS DISTINCT FROM (NEW.prompt_tokens, NEW.completion_tokens, NEW.cost_micros, NEW.status, NEW.outcome,
			NEW.tenant_id, NEW.key_id, NEW.model)))
	EXECUTE FUNCTION ledger_usage_event();
INSERT INTO usage_events (request_id, version, ts, tenant_id, key_id, model, endpoint,
	prompt_tokens, completion_tokens, cost_micros, status, outcome, replay_of)
SELECT id, 1, ts, tenant_id, key_id, model, endpoint,
	prompt_tokens, completion_tokens, cost_micros, status, outcome, replay_of
FROM ledger WHERE outcome <> 'open' AND tenant_id <> 0 ORDER BY ts, rowid;

CREATE TABLE usage_sinks (
	url          TEXT   PRIMARY KEY,
	after_seq    BIGINT NOT NULL DEFAULT 0,
	holder       TEXT   NOT NULL DEFAULT '',
	lease_until  BIGINT NOT NULL DEFAULT 0,
	delivered_at BIGINT NOT NULL DEFAULT 0,
	last_error   TEXT   NOT NULL DEFAULT ''
);
