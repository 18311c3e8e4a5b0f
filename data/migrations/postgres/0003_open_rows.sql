-- PostgreSQL's variant of 0003_open_rows.sql: the same two triggers, both
-- calling the function of 0001_init.sql.
DROP TRIGGER ledger_tenant_spend ON ledger;
CREATE TRIGGER ledger_tenant_spend AFTER INSERT ON ledger
	FOR EACH ROW WHEN (NEW.outcome <> 'open')
	EXECUTE FUNCTION ledger_tenant_spend();
CREATE TRIGGER ledger_tenant_spend_settle AFTER UPDATE OF outcome ON ledger
	FOR EACH ROW WHEN (OLD.outcome = 'open' AND NEW.outcome <> 'open')
	EXECUTE FUNCTION ledger_tenant_spend();
CREATE INDEX ledger_open ON ledger (id) WHERE outcome = 'open';
