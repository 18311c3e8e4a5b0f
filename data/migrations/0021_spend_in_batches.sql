-- Spend (tenant_spend, tenant_daily_spend, key_spend, api_keys.last_used_at)
-- is kept by the transactions that write ledger rows, one statement per
-- tenant, day, key touched by a batch (data/spend.go), instead of triggers
-- that fired for every final row. The totals are the same; ledger_live_done
-- (0015) stays.
DROP TRIGGER ledger_tenant_spend;
DROP TRIGGER ledger_tenant_spend_settle;
DROP TRIGGER ledger_period_spend;
DROP TRIGGER ledger_period_spend_settle;
