package data

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
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
// or NULL for an open row or one with none. buf is scratch space for the
// JSON, kept by the caller from row to row.
func attemptLogArg(r *LedgerRow, buf *[]byte) any {
	if r.Outcome == OutcomeOpen || len(r.AttemptLog) == 0 {
		return nil
	}
	*buf = appendAttemptLog((*buf)[:0], r.AttemptLog)
	return string(*buf)
}

// appendAttemptLog appends log as the JSON array encoding/json makes of it
// as []attemptJSON (parseAttemptLog decodes it so), written by hand: on the
// ledger writer's path for every final row, json.Marshal's reflection was
// 4.5 % of the writer's CPU at 1000 answers a second (perf, the lead's
// profile of 2026-12-07: 122 of its 2,754 samples). The one difference:
// '<', '>' and '&' are not escaped (the same string either way once
// decoded).
func appendAttemptLog(b []byte, log []Attempt) []byte {
	us := func(b []byte, key string, d time.Duration) []byte {
		b = append(b, key...)
		if d < 0 {
			return append(b, "null"...)
		}
		return strconv.AppendInt(b, d.Microseconds(), 10)
	}
	b = append(b, '[')
	for i := range log {
		a := &log[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = appendInt(b, `{"n":`, int64(a.N))
		b = append(b, `,"replica":`...)
		b = appendString(b, a.Replica)
		b = append(b, `,"role":`...)
		b = appendString(b, a.Role)
		b = appendInt(b, `,"start_us":`, a.Start.Microseconds())
		b = us(b, `,"ttft_us":`, a.TTFT)
		b = us(b, `,"end_us":`, a.End)
		b = append(b, `,"outcome":`...)
		b = appendString(b, a.Outcome)
		if a.Reason != "" {
			b = append(b, `,"reason":`...)
			b = appendString(b, a.Reason)
		}
		b = appendInt(b, `,"prompt_tokens":`, a.PromptTokens)
		b = appendInt(b, `,"completion_tokens":`, a.CompletionTokens)
		b = append(b, '}')
	}
	return append(b, ']')
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
