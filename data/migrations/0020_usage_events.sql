-- Usage events: each final ledger row of a tenant's request, as exported
-- (GET /admin/v1/usage/events, the usage webhook) under an id that never
-- changes, its request id and its version. A row's first final form is
-- version 1: inserted final, or an open row made final (its final row, or
-- settled as interrupted). A final row whose billed figures change later
-- (a correction) gets the next version, a new event; the earlier one stays
-- as it was. Open rows and rows of no tenant (refused before a key was
-- known) are not usage of anyone and are not exported.
--
-- seq is the export's order and its cursor. SQLite has one writer at a
-- time, so the rowid each event gets in the transaction that writes its
-- ledger row is in commit order: a reader that saw seq N has seen every
-- event below N and no later commit can add one there. (PostgreSQL's
-- variant assigns seq in a separate, serialized step instead.) Events are
-- never deleted, so rowids are never reused.
--
-- replay_of names the request whose recorded answer this one replayed
-- (Idempotency-Key, 0019): such a row bills nothing and says so.
--
-- The event keeps what it bills as it was then (tokens, cost, status), so
-- reading a version again gives the same event. endpoint is new on the
-- ledger too: the public path the request came in on.
ALTER TABLE ledger ADD COLUMN endpoint TEXT NOT NULL DEFAULT '';
CREATE TABLE usage_events (
	seq               INTEGER PRIMARY KEY,
	request_id        TEXT    NOT NULL,
	version           INTEGER NOT NULL,
	ts                INTEGER NOT NULL,
	tenant_id         INTEGER NOT NULL,
	key_id            TEXT    NOT NULL,
	model             TEXT    NOT NULL,
	endpoint          TEXT    NOT NULL,
	prompt_tokens     INTEGER NOT NULL,
	completion_tokens INTEGER NOT NULL,
	cost_micros       INTEGER NOT NULL,
	status            INTEGER NOT NULL,
	outcome           TEXT    NOT NULL,
	replay_of         TEXT    NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX usage_events_version ON usage_events (request_id, version);
CREATE TRIGGER ledger_usage_event AFTER INSERT ON ledger
WHEN NEW.outcome <> 'open' AND NEW.tenant_id <> 0
BEGIN
	INSERT INTO usage_events (request_id, version, ts, tenant_id, key_id, model, endpoint,
		prompt_tokens, completion_tokens, cost_micros, status, outcome, replay_of)
	VALUES (NEW.id, COALESCE((SELECT MAX(version) FROM usage_events WHERE request_id = NEW.id), 0) + 1,
		NEW.ts, NEW.tenant_id, NEW.key_id, NEW.model, NEW.endpoint,
		NEW.prompt_tokens, NEW.completion_tokens, NEW.cost_micros, NEW.status, NEW.outcome, NEW.replay_of);
END;
CREATE TRIGGER ledger_usage_event_update AFTER UPDATE ON ledger
WHEN NEW.outcome <> 'open' AND NEW.tenant_id <> 0 AND (OLD.outcome = 'open'
	OR OLD.prompt_tokens <> NEW.prompt_tokens OR OLD.completion_tokens <> NEW.completion_tokens
	OR OLD.cost_micros <> NEW.cost_micros OR OLD.status <> NEW.status OR OLD.outcome <> NEW.outcome
	OR OLD.tenant_id <> NEW.tenant_id OR OLD.key_id <> NEW.key_id OR OLD.model <> NEW.model)
BEGIN
	INSERT INTO usage_events (request_id, version, ts, tenant_id, key_id, model, endpoint,
		prompt_tokens, completion_tokens, cost_micros, status, outcome, replay_of)
	VALUES (NEW.id, COALESCE((SELECT MAX(version) FROM usage_events WHERE request_id = NEW.id), 0) + 1,
		NEW.ts, NEW.tenant_id, NEW.key_id, NEW.model, NEW.endpoint,
		NEW.prompt_tokens, NEW.completion_tokens, NEW.cost_micros, NEW.status, NEW.outcome, NEW.replay_of);
END;
-- The rows final before this migration are events too, in ledger order.
INSERT INTO usage_events (request_id, version, ts, tenant_id, key_id, model, endpoint,
	prompt_tokens, completion_tokens, cost_micros, status, outcome, replay_of)
SELECT id, 1, ts, tenant_id, key_id, model, endpoint,
	prompt_tokens, completion_tokens, cost_micros, status, outcome, replay_of
FROM ledger WHERE outcome <> 'open' AND tenant_id <> 0 ORDER BY ts, rowid;

-- A usage webhook's delivery state, by its URL: after_seq is the cursor of
-- the last event it acknowledged (2xx), so a restarted gateway resumes
-- there. holder and lease_until say which gateway delivers to it (one at a
-- time, when several share a PostgreSQL database).
CREATE TABLE usage_sinks (
	url          TEXT   PRIMARY KEY,
	after_seq    BIGINT NOT NULL DEFAULT 0,
	holder       TEXT   NOT NULL DEFAULT '',
	lease_until  BIGINT NOT NULL DEFAULT 0,
	delivered_at BIGINT NOT NULL DEFAULT 0,
	last_error   TEXT   NOT NULL DEFAULT ''
);
