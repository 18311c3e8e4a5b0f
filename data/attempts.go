package data

import (
	"context"
	"encoding/json"
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

// attemptJSON is an Attempt as the ledger's attempt_log column keeps it;
// times in microseconds, null when unknown.
type attemptJSON struct {
	N          int    `json:"n"`
	Replica    string `json:"replica"`
	Role       string `json:"role"`
	StartUS    int64  `json:"start_us"`
	TTFTUS     *int64 `json:"ttft_us"`
	EndUS      *int64 `json:"end_us"`
	Outcome    string `json:"outcome"`
	Reason     string `json:"reason,omitempty"`
	Prompt     int64  `json:"prompt_tokens"`
	Completion int64  `json:"completion_tokens"`
}

// attemptLogArg is the attempt_log column of row r: its attempts as JSON,
// or NULL for an open row or one with none.
func attemptLogArg(r LedgerRow) (any, error) {
	if r.Outcome == OutcomeOpen || len(r.AttemptLog) == 0 {
		return nil, nil
	}
	us := func(d time.Duration) *int64 {
		if d < 0 {
			return nil
		}
		v := d.Microseconds()
		return &v
	}
	out := make([]attemptJSON, len(r.AttemptLog))
	for i, a := range r.AttemptLog {
		out[i] = attemptJSON{N: a.N, Replica: a.Replica, Role: a.Role, StartUS: a.Start.Microseconds(),
			TTFTUS: us(a.TTFT), EndUS: us(a.End), Outcome: a.Outcome, Reason: a.Reason,
			Prompt: a.PromptTokens, Completion: a.CompletionTokens}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("attempt log of %s: %w", r.ID, err)
	}
	return string(b), nil
}

// parseAttemptLog reads an attempt_log column back.
func parseAttemptLog(raw string) ([]Attempt, error) {
	var in []attemptJSON
	if err := json.Unmarshal([]byte(raw), &in); err != nil {
		return nil, err
	}
	d := func(v *int64) time.Duration {
		if v == nil {
			return -1
		}
		return time.Duration(*v) * time.Microsecond
	}
	out := make([]Attempt, len(in))
	for i, a := range in {
		out[i] = Attempt{N: a.N, Replica: a.Replica, Role: a.Role, Start: time.Duration(a.StartUS) * time.Microsecond,
			TTFT: d(a.TTFTUS), End: d(a.EndUS), Outcome: a.Outcome, Reason: a.Reason,
			PromptTokens: a.Prompt, CompletionTokens: a.Completion}
	}
	return out, nil
}

// fillAttempts sets the AttemptLog of rows from their attempt_log column.
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
	q := `SELECT id, attempt_log FROM ledger WHERE attempt_log IS NOT NULL AND id IN (` +
		strings.TrimSuffix(strings.Repeat("?,", len(args)), ",") + `)`
	res, err := s.read.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer res.Close()
	for res.Next() {
		var id, raw string
		if err := res.Scan(&id, &raw); err != nil {
			return err
		}
		log, err := parseAttemptLog(raw)
		if err != nil {
			return fmt.Errorf("attempt log of %s: %w", id, err)
		}
		if i, ok := at[id]; ok {
			rows[i].AttemptLog = log
		}
	}
	return res.Err()
}
