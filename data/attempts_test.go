package data

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"
)

// A request's attempts ride with its final ledger row through the writer, in
// the row's own transaction, and come back with it from FindRequests; an
// open row carries none, and a batch sent again stores nothing twice.
func TestAttemptsStoredWithTheirLedgerRow(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		w := s.NewLedgerWriter(LedgerConfig{FlushInterval: time.Millisecond}, nil)
		go w.Run(ctx)
		defer w.Close()

		hedged := []Attempt{
			{N: 1, Replica: "sim-a", Role: "first", Start: time.Millisecond, TTFT: -1, End: 90 * time.Millisecond,
				Outcome: AttemptCancelled, Reason: "another attempt won", PromptTokens: 12},
			{N: 2, Replica: "sim-b", Role: "hedge", Start: 60 * time.Millisecond, TTFT: 5 * time.Millisecond, End: 120 * time.Millisecond,
				Outcome: AttemptWon, PromptTokens: 12, CompletionTokens: 4},
		}
		retried := []Attempt{
			{N: 1, Replica: "sim-a", Role: "first", TTFT: -1, End: 2 * time.Millisecond, Outcome: AttemptFailed, Reason: "not_sent: connection refused"},
			{N: 2, Replica: "sim-b", Role: "retry", Start: 3 * time.Millisecond, TTFT: 4 * time.Millisecond, End: -1, Outcome: AttemptWon, PromptTokens: 7, CompletionTokens: 2},
		}
		w.Open(LedgerRow{ID: "req-h", TenantID: 1, Stages: UnknownStages(), AttemptLog: hedged[:1]})
		if err := w.Commit(ctx, LedgerRow{ID: "req-h", TenantID: 1, Attempts: 2, Hedged: true, Stages: UnknownStages(), AttemptLog: hedged}); err != nil {
			t.Fatal(err)
		}
		// Many rows in one batch: the attempts take every statement size.
		for i := range 70 {
			w.Add(LedgerRow{ID: fmt.Sprintf("req-%d", i), TenantID: 1, Stages: UnknownStages(), AttemptLog: retried})
		}
		w.Open(LedgerRow{ID: "req-open", TenantID: 1, Stages: UnknownStages(), AttemptLog: retried})
		if err := w.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		// Sent again (a commit whose result was lost): nothing doubles.
		if err := s.InsertLedger(ctx, []LedgerRow{{ID: "req-h", TenantID: 1, Stages: UnknownStages(), AttemptLog: hedged}}); err != nil {
			t.Fatal(err)
		}

		for id, want := range map[string][]Attempt{"req-h": hedged, "req-69": retried, "req-open": nil} {
			rows, err := s.FindRequests(ctx, RequestFilter{ID: id})
			if err != nil || len(rows) != 1 {
				t.Fatalf("FindRequests(%s): %d rows, %v", id, len(rows), err)
			}
			if got := rows[0].AttemptLog; !reflect.DeepEqual(got, want) {
				t.Errorf("%s: attempts read back\n%+v\nwant\n%+v", id, got, want)
			}
		}
		var n int
		if err := s.read.QueryRow(`SELECT COUNT(*) FROM ledger WHERE attempt_log IS NOT NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if want := 1 + 70; n != want {
			t.Errorf("%d rows carry attempts, want %d", n, want)
		}
		// The list view fills every row's attempts with one query.
		rows, err := s.FindRequests(ctx, RequestFilter{Limit: 5})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.ID != "req-open" && len(r.AttemptLog) != 2 {
				t.Errorf("list: %s has %d attempts, want 2", r.ID, len(r.AttemptLog))
			}
		}
	})
}

// TestAttemptLogJSONIsEncodingJSONs: the attempt_log column, encoded by hand
// on the writer's path, is what json.Marshal makes of the attempts (the
// format it had), and reads back as the attempts it was made of.
func TestAttemptLogJSONIsEncodingJSONs(t *testing.T) {
	logs := [][]Attempt{
		{{N: 1, Replica: "replica-1", Role: "first", Start: 300 * time.Microsecond, TTFT: -1, End: 900 * time.Millisecond,
			Outcome: AttemptWon, PromptTokens: 42, CompletionTokens: 128}},
		{{N: 1, Replica: "sim-a", Role: "first", Start: 0, TTFT: 5 * time.Millisecond, End: -1, Outcome: AttemptCancelled,
			Reason: "another attempt won", PromptTokens: 42},
			{N: 2, Replica: "http://10.0.0.2:8000/v1 \"q\"\n\tä\x01", Role: "hedge", Start: 60 * time.Millisecond,
				TTFT: 5 * time.Millisecond, End: 120 * time.Millisecond, Outcome: AttemptFailed, Reason: "HTTP 503",
				PromptTokens: -1, CompletionTokens: 1 << 40}},
	}
	for _, log := range logs {
		r := LedgerRow{ID: "x", Outcome: OutcomeOK, AttemptLog: log}
		var buf []byte
		got := attemptLogArg(&r, &buf).(string)
		out := make([]attemptJSON, len(log))
		for i, a := range log {
			us := func(d time.Duration) *int64 {
				if d < 0 {
					return nil
				}
				v := d.Microseconds()
				return &v
			}
			out[i] = attemptJSON{N: a.N, Replica: a.Replica, Role: a.Role, StartUS: a.Start.Microseconds(),
				TTFTUS: us(a.TTFT), EndUS: us(a.End), Outcome: a.Outcome, Reason: a.Reason,
				Prompt: a.PromptTokens, Completion: a.CompletionTokens}
		}
		want, err := json.Marshal(out)
		if err != nil {
			t.Fatal(err)
		}
		if got != string(want) {
			t.Errorf("attempt log\n got %s\nwant %s", got, want)
		}
		back, err := parseAttemptLog(got)
		if err != nil || !reflect.DeepEqual(back, log) {
			t.Errorf("read back as %+v (%v), want %+v", back, err, log)
		}
	}
	open := LedgerRow{ID: "x", Outcome: OutcomeOpen, AttemptLog: logs[0]}
	var buf []byte
	if v := attemptLogArg(&open, &buf); v != nil {
		t.Errorf("an open row's attempt log is %v, want NULL", v)
	}
}
