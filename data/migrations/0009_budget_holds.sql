-- Several gateways on one database (PostgreSQL). Each running gateway has a
-- row in gateways, its lease renewed while it runs; a ledger row names the
-- gateway that wrote it; budget_holds is what each gateway holds of each
-- tenant's budget for requests it admitted and whose final rows are not
-- written yet. On PostgreSQL admission grows a hold only while the tenant's
-- spend plus every hold fits the budget, and a final ledger row moves its
-- cost from its gateway's hold into spend in the same transaction (see
-- migrations/postgres). SQLite serves one gateway, which keeps its
-- reservations in memory: there the tables stay empty.
ALTER TABLE ledger ADD COLUMN gateway TEXT NOT NULL DEFAULT '';
CREATE TABLE gateways (
	id          TEXT   PRIMARY KEY,
	started_at  BIGINT NOT NULL,
	lease_until BIGINT NOT NULL
);
CREATE TABLE budget_holds (
	gateway   TEXT   NOT NULL,
	tenant_id BIGINT NOT NULL,
	tokens    BIGINT NOT NULL DEFAULT 0,
	micros    BIGINT NOT NULL DEFAULT 0,
	PRIMARY KEY (gateway, tenant_id)
);
