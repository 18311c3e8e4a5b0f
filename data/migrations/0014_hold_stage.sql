-- How long a request waited for a replica of its model to become ready (a
-- cold start held it; see the gateway's --hold-queue), in microseconds;
-- NULL when it did not wait or on rows written before.
ALTER TABLE ledger ADD COLUMN hold_us INTEGER;
