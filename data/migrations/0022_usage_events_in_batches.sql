-- The usage events of final rows inserted into the ledger are written by
-- the transaction that inserts them, one statement per transaction
-- (data/ledger.go, usageEventsSQL), instead of by a trigger that
-- fired for every row. The events are the same: each final row of a tenant
-- inserted is version 1 of its request (ledger rows are never deleted, so
-- none had an event before), with the same figures, numbered by seq in the
-- transaction that writes it. Store.InsertLedger is the ledger's one
-- inserter. An open row made final, or a final row corrected, is still an
-- event by ledger_usage_event_update (0020).
DROP TRIGGER ledger_usage_event;
