-- Priority classes. A key's class ('interactive', 'standard' or 'batch') is
-- the highest a request made with it may run as; every key made before this
-- migration is standard. A ledger row records the class the request ran as
-- ('' for rows written before, or a request refused before its class was
-- known) and how long it waited in the admission queue (NULL: it did not
-- reach the queue).
ALTER TABLE api_keys ADD COLUMN class TEXT NOT NULL DEFAULT 'standard';
ALTER TABLE ledger ADD COLUMN priority TEXT NOT NULL DEFAULT '';
ALTER TABLE ledger ADD COLUMN queue_us INTEGER;
