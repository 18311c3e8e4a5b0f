-- One live credential per replica id, enforced where it is issued: a
-- partial unique index, so two gateways sharing the database that admit
-- the same id at once issue one credential and refuse the other. Older
-- live credentials of an id that has several (issued before this index)
-- are revoked at the time the newer one was issued; the newest stays.
UPDATE worker_credentials SET revoked_at = (
	SELECT MIN(n.created_at) FROM worker_credentials n
	WHERE n.replica_id = worker_credentials.replica_id AND n.revoked_at IS NULL
		AND (n.created_at > worker_credentials.created_at OR (n.created_at = worker_credentials.created_at AND n.id > worker_credentials.id)))
WHERE revoked_at IS NULL AND EXISTS (
	SELECT 1 FROM worker_credentials n
	WHERE n.replica_id = worker_credentials.replica_id AND n.revoked_at IS NULL
		AND (n.created_at > worker_credentials.created_at OR (n.created_at = worker_credentials.created_at AND n.id > worker_credentials.id)));

CREATE UNIQUE INDEX worker_credentials_live ON worker_credentials (replica_id) WHERE revoked_at IS NULL;
