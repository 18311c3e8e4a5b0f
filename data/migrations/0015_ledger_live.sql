-- The billable figures of a running stream, apart from its open ledger row.
-- The ledger writer refreshes them every ~60 ms for every stream in flight;
-- on the wide ledger row each refresh rewrote every page holding an open
-- row (about 40 pages a transaction with 500 streams open), here it rewrites
-- a narrow table of a few pages. While a row is open its figures are these,
-- when present; once the row stops being open (its final row, or settling
-- at start-up, which takes these figures first) they are deleted.
CREATE TABLE ledger_live (
	id TEXT PRIMARY KEY,
	prompt_tokens INTEGER NOT NULL,
	completion_tokens INTEGER NOT NULL,
	hedge_overhead_tokens INTEGER NOT NULL,
	cost_micros INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TRIGGER ledger_live_done AFTER UPDATE ON ledger
WHEN OLD.outcome = 'open'
BEGIN
	DELETE FROM ledger_live WHERE id = OLD.id;
END;
