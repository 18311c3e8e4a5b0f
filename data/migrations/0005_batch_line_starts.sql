-- Lines that started running and have no result yet, with how many times
-- they started. A clean stop clears its lines' rows; a gateway killed mid-
-- line leaves them, and a line found here twice at start-up is failed
-- instead of run a third time (a line that crashes the gateway must not
-- crash every restart).
CREATE TABLE batch_line_starts (
	batch_id TEXT    NOT NULL,
	line     INTEGER NOT NULL,
	starts   INTEGER NOT NULL,
	PRIMARY KEY (batch_id, line)
) WITHOUT ROWID;
