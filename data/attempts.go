package data

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// How an attempt ended ([Attempt.Outcome]).
const (
	AttemptWon       = "won"       // its answer is the one the client got
	AttemptCancelled = "cancelled" // stopped by the gateway: another attempt won, or the client left
	AttemptFailed    = "failed"    // the replica failed it; Reason says how
)

// Attempt is one upstream attempt of a request: the first, a hedge or a
// retry. Times are offsets from the request's arrival; a negative TTFT or
// End is unknown (no first token; still running when the row was built)
// and is stored as NULL.
type Attempt struct {
	N       int    // 1, 2, … in the order the attempts started
	Replica string // the replica it went to
	Role    string // "first", "hedge" or "retry"
	Start   time.Duration
	TTFT    time.Duration // from its start to its first token
	End     time.Duration
	Outcome string // AttemptWon, AttemptCancelled or AttemptFailed
	Reason  string // why it failed or was cancelled; "" for the winner
	// The tokens it cost: the billed usage for the winner, what the engine
	// burned (or an estimate of it) for the others.
	PromptTokens     int64
	CompletionTokens int64
}

var attemptCols = [...]string{
	"request_id", "n", "replica", "role", "start_us", "ttft_us", "end_us",
	"outcome", "reason", "prompt_tokens", "completion_tokens",
}

// attemptInsertSQL inserts rows attempts. An attempt already stored (a
// batch sent again after an ambiguous failure) is left as it is: attempts
// come with final ledger rows only, which are never replaced either.
func attemptInsertSQL(rows int) string {
	one := "(" + strings.TrimSuffix(strings.Repeat("?,", len(attemptCols)), ",") + ")"
	var b strings.Builder
	b.WriteString("INSERT INTO request_attempts (" + strings.Join(attemptCols[:], ", ") + ") VALUES ")
	for i := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(one)
	}
	b.WriteString(" ON CONFLICT (request_id, n) DO NOTHING")
	return b.String()
}

// insertAttempts writes the attempts of rows' final rows in tx, in as few
// statements as ledger rows take (args is a spare argument buffer). A row
// with no ID has no attempts stored: nothing could find them.
func (s *Store) insertAttempts(ctx context.Context, tx *sql.Tx, rows []LedgerRow, args []any) error {
	n := 0
	for _, r := range rows {
		if r.Outcome != OutcomeOpen && r.ID != "" {
			n += len(r.AttemptLog)
		}
	}
	if n == 0 {
		return nil
	}
	// Walk the attempts row by row, filling statements of the largest
	// chunk that still fits what is left.
	ri, ai := 0, 0
	next := func() (string, Attempt) {
		for {
			r := rows[ri]
			if r.Outcome != OutcomeOpen && r.ID != "" && ai < len(r.AttemptLog) {
				ai++
				return r.ID, r.AttemptLog[ai-1]
			}
			ri, ai = ri+1, 0
		}
	}
	for i, size := range ledgerChunks {
		if n < size {
			continue
		}
		st := tx.StmtContext(ctx, s.attemptStmts[i])
		for n >= size {
			args = args[:0]
			for range size {
				id, a := next()
				args = append(args, id, int64(a.N), a.Replica, a.Role, a.Start.Microseconds(),
					stageArg(a.TTFT), stageArg(a.End), a.Outcome, a.Reason, a.PromptTokens, a.CompletionTokens)
			}
			if _, err := st.ExecContext(ctx, args...); err != nil {
				return fmt.Errorf("attempts: %w", err)
			}
			n -= size
		}
	}
	return nil
}

// fillAttempts sets the AttemptLog of rows from the stored attempts.
func (s *Store) fillAttempts(ctx context.Context, rows []LedgerRow) error {
	if len(rows) == 0 {
		return nil
	}
	at := make(map[string]int, len(rows))
	args := make([]any, 0, len(rows))
	for i, r := range rows {
		at[r.ID] = i
		args = append(args, r.ID)
	}
	q := `SELECT ` + strings.Join(attemptCols[:], ", ") + ` FROM request_attempts WHERE request_id IN (` +
		strings.TrimSuffix(strings.Repeat("?,", len(args)), ",") + `) ORDER BY request_id, n`
	res, err := s.read.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer res.Close()
	for res.Next() {
		var (
			id          string
			a           Attempt
			n, start    int64
			ttft, ended sql.NullInt64
		)
		if err := res.Scan(&id, &n, &a.Replica, &a.Role, &start, &ttft, &ended, &a.Outcome, &a.Reason,
			&a.PromptTokens, &a.CompletionTokens); err != nil {
			return err
		}
		a.N, a.Start = int(n), time.Duration(start)*time.Microsecond
		a.TTFT, a.End = stageFromNull(ttft), stageFromNull(ended)
		if i, ok := at[id]; ok {
			rows[i].AttemptLog = append(rows[i].AttemptLog, a)
		}
	}
	return res.Err()
}
