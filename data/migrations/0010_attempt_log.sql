-- Every attempt of a request, not only the one that answered: the first,
-- its hedge, a retry; which replica each went to, when it started and
-- ended (microseconds after the request arrived), its time to first token,
-- how it ended (won, cancelled, failed) and why, and the tokens it cost —
-- a JSON array on the request's final ledger row (NULL on open rows and on
-- rows of requests that made no attempt). A column of the row, not a table
-- of its own: the ledger's transaction writes no second B-tree for it.
ALTER TABLE ledger ADD COLUMN attempt_log TEXT;
