-- PostgreSQL's variant of 0021_spend_in_batches.sql: the triggers and the
-- functions they called. A final row's cost leaves its gateway's budget
-- hold in the transaction that writes it, as before (data/spend.go).
DROP TRIGGER ledger_tenant_spend ON ledger;
DROP TRIGGER ledger_tenant_spend_settle ON ledger;
DROP TRIGGER ledger_period_spend ON ledger;
DROP TRIGGER ledger_period_spend_settle ON ledger;
DROP FUNCTION ledger_tenant_spend();
DROP FUNCTION ledger_period_spend();
