-- Several gateways on one database (PostgreSQL) run batches: a batch is
-- run by the gateway named in gateway ('' while none has claimed it), for
-- as long as that gateway's lease in gateways lasts; another claims it once
-- the lease has run out. On SQLite (one gateway) it stays ''.
ALTER TABLE batches ADD COLUMN gateway TEXT NOT NULL DEFAULT '';
