-- Registered replicas whose lease ended (their worker stopped sending
-- heartbeats), kept so that a restarted gateway still lists them as lost,
-- with why, until their worker is heard again, an operator forgets or
-- revokes them, or the forget time passes. models is a JSON array; lost_at
-- is microseconds; was is the state the replica was in when it was lost.
CREATE TABLE lost_replicas (
	replica_id TEXT   PRIMARY KEY,
	worker_id  TEXT   NOT NULL DEFAULT '',
	address    TEXT   NOT NULL,
	models     TEXT   NOT NULL DEFAULT '[]',
	reason     TEXT   NOT NULL,
	was        TEXT   NOT NULL DEFAULT '',
	lost_at    BIGINT NOT NULL
);
