-- PostgreSQL's variant of 0022_usage_events_in_batches.sql: PostgreSQL
-- keeps the trigger ledger_usage_event (0020). Gateways sharing the
-- database insert ledger rows concurrently, so a transaction cannot tell
-- its own inserted rows by a rowid range as SQLite's single writer can;
-- the events are the same on both engines.
SELECT 1;
