package data

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// streamRow is a stream's ledger row with the given tokens; cost is a
// micro-unit per token, so spend in tokens and micros must agree.
func streamRow(id string, tenant int64, outcome Outcome, prompt, completion int64) LedgerRow {
	return LedgerRow{
		ID: id, TenantID: tenant, KeyID: "key_test", Model: "m", Stream: true,
		PromptTokens: prompt, CompletionTokens: completion, CostMicros: prompt + completion,
		Status: 200, Outcome: outcome, Attempts: 1, Stages: UnknownStages(),
	}
}

func rowByID(t *testing.T, s *Store, id string) LedgerRow {
	t.Helper()
	rows, err := s.queryLedger(context.Background(), ledgerSelect+` WHERE l.id = ?`, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("%d rows with id %s, want 1", len(rows), id)
	}
	return rows[0]
}

// liveRows counts the open rows' figures kept apart (ledger_live).
func liveRows(t *testing.T, s *Store) int {
	t.Helper()
	var n int
	if err := s.read.QueryRow(`SELECT COUNT(*) FROM ledger_live`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func spendOf(t *testing.T, s *Store, tenant int64) Spend {
	t.Helper()
	sp, err := s.TenantSpend(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return sp[tenant]
}

// checkSpendMatchesLedger pins the invariant budgets rely on: tenant spend is
// the sum of the final rows, and open rows count for nothing.
func checkSpendMatchesLedger(t *testing.T, s *Store) {
	t.Helper()
	rows, err := s.read.Query(`SELECT tenant_id, SUM(prompt_tokens + completion_tokens), SUM(cost_micros)
		FROM ledger WHERE outcome <> 'open' GROUP BY tenant_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	want := map[int64]Spend{}
	for rows.Next() {
		var id int64
		var sp Spend
		if err := rows.Scan(&id, &sp.Tokens, &sp.Micros); err != nil {
			t.Fatal(err)
		}
		want[id] = sp
	}
	got, err := s.TenantSpend(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for id, sp := range got {
		if sp != want[id] {
			t.Errorf("tenant %d: spend %+v, final ledger rows sum to %+v", id, sp, want[id])
		}
	}
	for id, sp := range want {
		if got[id] != sp {
			t.Errorf("tenant %d: spend %+v, final ledger rows sum to %+v", id, got[id], sp)
		}
	}
}

func TestInsertLedgerReplacesOnlyOpenRows(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		const tn = 1
		open := func(id string, c int64) LedgerRow { return streamRow(id, tn, OutcomeOpen, 10, c) }
		final := func(id string, c int64) LedgerRow { return streamRow(id, tn, OutcomeOK, 10, c) }
		for _, tc := range []struct {
			name string
			// batches are written in order, each in one InsertLedger (rows of
			// one batch share a statement when they fit one).
			batches [][]LedgerRow
			want    LedgerRow
		}{
			{"open then final, one statement", [][]LedgerRow{{open("a", 1), open("a", 2), final("a", 3)}}, final("a", 3)},
			{"final wins over later opens and finals", [][]LedgerRow{{open("a", 1), final("a", 3), open("a", 4), final("a", 5)}}, final("a", 3)},
			{"open updated across transactions", [][]LedgerRow{{open("a", 1)}, {open("a", 7)}}, open("a", 7)},
			{"final replaces stored open", [][]LedgerRow{{open("a", 1)}, {open("a", 2)}, {final("a", 9)}}, final("a", 9)},
			{"late open leaves stored final", [][]LedgerRow{{final("a", 5)}, {open("a", 8)}}, final("a", 5)},
			{"retried final is not billed twice", [][]LedgerRow{{final("a", 5)}, {final("a", 5)}}, final("a", 5)},
		} {
			t.Run(tc.name, func(t *testing.T) {
				s := e.open(t)
				for _, b := range tc.batches {
					if err := s.InsertLedger(context.Background(), b); err != nil {
						t.Fatal(err)
					}
				}
				got := rowByID(t, s, "a")
				if got.Outcome != tc.want.Outcome || got.CompletionTokens != tc.want.CompletionTokens {
					t.Errorf("stored %s with %d completion tokens, want %s with %d",
						got.Outcome, got.CompletionTokens, tc.want.Outcome, tc.want.CompletionTokens)
				}
				wantSpend := Spend{}
				if tc.want.Outcome != OutcomeOpen {
					wantSpend = Spend{10 + tc.want.CompletionTokens, 10 + tc.want.CompletionTokens}
				}
				if sp := spendOf(t, s, tn); sp != wantSpend {
					t.Errorf("spend %+v, want %+v", sp, wantSpend)
				}
				checkSpendMatchesLedger(t, s)
			})
		}
	})
}

func TestOpenRowIsUpdatedThenReplacedByItsFinalRow(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		w := s.NewLedgerWriter(LedgerConfig{FlushInterval: time.Millisecond}, nil)
		ran := make(chan error, 1)
		go func() { ran <- w.Run(ctx) }()

		for c := range int64(20) {
			w.Open(streamRow("s", 1, OutcomeOK, 10, c)) // Open marks it open whatever it says
			if c == 0 {
				if err := w.Flush(ctx); err != nil { // stored: the rest are refreshes
					t.Fatal(err)
				}
			}
		}
		if err := w.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if got := rowByID(t, s, "s"); got.Outcome != OutcomeOpen || got.CompletionTokens != 19 {
			t.Errorf("after Opens: %s with %d tokens, want open with 19", got.Outcome, got.CompletionTokens)
		}
		if n := liveRows(t, s); n != 1 {
			t.Errorf("%d rows of live figures after refreshes, want the stream's 1", n)
		}
		if sp := spendOf(t, s, 1); sp != (Spend{}) {
			t.Errorf("an open row is spend already: %+v", sp)
		}
		if u, err := s.Usage(ctx, UsageFilter{}); err != nil || len(u) != 0 {
			t.Errorf("Usage counts an open row: %+v, %v", u, err)
		}

		if err := w.Commit(ctx, streamRow("s", 1, OutcomeOK, 10, 25)); err != nil {
			t.Fatal(err)
		}
		if got := rowByID(t, s, "s"); got.Outcome != OutcomeOK || got.CompletionTokens != 25 {
			t.Errorf("after Commit: %s with %d tokens, want ok with 25", got.Outcome, got.CompletionTokens)
		}
		if n := liveRows(t, s); n != 0 {
			t.Errorf("%d rows of live figures once the stream's row is final, want none", n)
		}
		// A late update and a repeated final change nothing.
		w.Open(streamRow("s", 1, OutcomeOpen, 10, 30))
		w.Add(streamRow("s", 1, OutcomeMidstream, 10, 40))
		if err := w.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if got := rowByID(t, s, "s"); got.Outcome != OutcomeOK || got.CompletionTokens != 25 {
			t.Errorf("final row overwritten: %s with %d tokens", got.Outcome, got.CompletionTokens)
		}
		if sp := spendOf(t, s, 1); sp != (Spend{35, 35}) {
			t.Errorf("spend %+v, want 35 tokens once", sp)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-ran; err != nil {
			t.Fatal(err)
		}
	})
}

func TestOpenRowRefreshWritesWhatChanged(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		w := s.NewLedgerWriter(LedgerConfig{}, nil)
		ran := make(chan error, 1)
		go func() { ran <- w.Run(ctx) }()
		open := func(r LedgerRow) {
			t.Helper()
			w.Open(r)
			if err := w.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
		v := streamRow("s", 1, OutcomeOpen, 10, 1)
		v.Upstream = "replica-1"
		open(v)
		v.CompletionTokens, v.CostMicros = 5, 15 // figures only: a refresh
		open(v)
		if got := rowByID(t, s, "s"); got.CompletionTokens != 5 || got.CostMicros != 15 || got.Upstream != "replica-1" || got.Outcome != OutcomeOpen {
			t.Errorf("after a refresh: %+v, want open, 5 tokens, cost 15 on replica-1", got)
		}
		txs := w.txs.Load()
		open(v) // nothing changed: nothing to write
		if n := w.txs.Load(); n != txs {
			t.Errorf("an unchanged open row took %d transactions", n-txs)
		}
		v.Upstream, v.CompletionTokens, v.CostMicros = "replica-2", 6, 16 // more than figures: the whole row
		open(v)
		if got := rowByID(t, s, "s"); got.CompletionTokens != 6 || got.Upstream != "replica-2" {
			t.Errorf("after a change of replica: %+v, want 6 tokens on replica-2", got)
		}
		if sp := spendOf(t, s, 1); sp != (Spend{}) {
			t.Errorf("an open row is spend already: %+v", sp)
		}
		// Final by another way (a settling at start-up): a refresh leaves it.
		fin := streamRow("s", 1, OutcomeInterrupted, 10, 6)
		fin.Upstream = "replica-2"
		if err := s.InsertLedger(ctx, []LedgerRow{fin}); err != nil {
			t.Fatal(err)
		}
		v.CompletionTokens, v.CostMicros = 9, 19
		open(v)
		if got := rowByID(t, s, "s"); got.Outcome != OutcomeInterrupted || got.CompletionTokens != 6 {
			t.Errorf("a refresh changed a final row: %s with %d tokens", got.Outcome, got.CompletionTokens)
		}
		checkSpendMatchesLedger(t, s)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-ran; err != nil {
			t.Fatal(err)
		}
	})
}

// sameButFigures must compare every field a ledger row stores: a field it
// missed would not reach a stored open row.
func TestSameButFiguresKnowsEveryField(t *testing.T) {
	if n := reflect.TypeFor[LedgerRow]().NumField(); n != 23 {
		t.Errorf("LedgerRow has %d fields, sameButFigures was written for 23: compare the new one there", n)
	}
}

func TestQueuedOpenRowsCoalesce(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		// No Run yet: everything stays queued, so what the queue holds is exact.
		w := s.NewLedgerWriter(LedgerConfig{}, nil)
		for c := range int64(1000) {
			w.Open(streamRow("a", 1, OutcomeOpen, 10, c))
			w.Open(streamRow("b", 1, OutcomeOpen, 10, c))
		}
		if n := w.Backlog(); n != 2 {
			t.Errorf("2000 updates of two open rows hold %d rows, want 2", n)
		}
		w.Add(streamRow("b", 1, OutcomeOK, 10, 2000)) // replaces b's queued open row in place
		if n := w.Backlog(); n != 2 {
			t.Errorf("a final row replacing a queued open one: %d rows held, want 2", n)
		}
		w.Open(streamRow("b", 1, OutcomeOpen, 10, 5)) // late: queued after the final, ignored when written
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if n := w.txs.Load(); n != 1 {
			t.Errorf("%d transactions, want 1", n)
		}
		if got := rowByID(t, s, "a"); got.Outcome != OutcomeOpen || got.CompletionTokens != 999 {
			t.Errorf("a: %s with %d tokens, want open with the last update's 999", got.Outcome, got.CompletionTokens)
		}
		if got := rowByID(t, s, "b"); got.Outcome != OutcomeOK || got.CompletionTokens != 2000 {
			t.Errorf("b: %s with %d tokens, want ok with 2000", got.Outcome, got.CompletionTokens)
		}
		checkSpendMatchesLedger(t, s)
	})
}

// The crash test runs a writer in a child process (this test binary, with
// crashHelperEnv set) and kills it with SIGKILL once its rows are committed.
const crashHelperEnv = "TAILGATE_DATA_CRASH_HELPER_DB"

// crashStreams are the streams the child leaves behind: each was opened and
// updated (last completion count = 10*i); the first finalDone finished.
const (
	crashStreams = 8
	crashFinal   = 3
)

func TestCrashHelperProcess(t *testing.T) {
	path := os.Getenv(crashHelperEnv)
	if path == "" {
		t.Skip("runs only as the child of TestSettleOpenAfterSIGKILL")
	}
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	w := s.NewLedgerWriter(LedgerConfig{}, nil)
	ctx := context.Background()
	go func() { _ = w.Run(ctx) }() // ends with the process: it is killed
	for i := range int64(crashStreams) {
		id := fmt.Sprintf("stream-%d", i)
		w.Open(streamRow(id, 1, OutcomeOpen, 100, 1))
		if err := w.Flush(ctx); err != nil { // a first version lands, then updates
			t.Fatal(err)
		}
		w.Open(streamRow(id, 1, OutcomeOpen, 100, 10*i))
	}
	for i := range int64(crashFinal) {
		if err := w.Commit(ctx, streamRow(fmt.Sprintf("stream-%d", i), 1, OutcomeOK, 100, 10*i+1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(ctx, streamRow("json-0", 1, OutcomeOK, 7, 3)); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	fmt.Println("ready")
	select {} // wait for SIGKILL: no Close, no drain
}

func TestSettleOpenAfterSIGKILL(t *testing.T) {
	if os.Getenv(crashHelperEnv) != "" {
		t.Skip("in the child")
	}
	path := filepath.Join(t.TempDir(), "tailgate.db")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	child := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashHelperProcess$")
	child.Env = append(os.Environ(), crashHelperEnv+"="+path)
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() && strings.TrimSpace(sc.Text()) != "ready" {
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	if sc.Err() != nil || ctx.Err() != nil {
		t.Fatalf("child never got ready: %v %v", sc.Err(), ctx.Err())
	}

	s := openAt(t, path)
	bg := context.Background()
	checkSpendMatchesLedger(t, s)
	if sp := spendOf(t, s, 1); sp.Tokens != 3*100+(0+1)+(10+1)+(20+1)+10 {
		t.Errorf("spend before settling = %d tokens, want the finished rows' 343", sp.Tokens)
	}
	n, err := s.SettleOpen(bg)
	if err != nil {
		t.Fatal(err)
	}
	if n != crashStreams-crashFinal {
		t.Errorf("SettleOpen settled %d rows, want %d", n, crashStreams-crashFinal)
	}
	var want int64 = 343
	for i := range int64(crashStreams) {
		got := rowByID(t, s, fmt.Sprintf("stream-%d", i))
		switch {
		case i < crashFinal:
			if got.Outcome != OutcomeOK || got.CompletionTokens != 10*i+1 {
				t.Errorf("finished stream %d: %s with %d tokens, want ok with %d", i, got.Outcome, got.CompletionTokens, 10*i+1)
			}
		default:
			want += 100 + 10*i
			if got.Outcome != OutcomeInterrupted || got.Error != ClassInterrupted || got.Status != 200 ||
				got.CompletionTokens != 10*i || got.PromptTokens != 100 {
				t.Errorf("cut stream %d: %s/%s/%d with %d+%d tokens, want interrupted/%s/200 with 100+%d",
					i, got.Outcome, got.Error, got.Status, got.PromptTokens, got.CompletionTokens, ClassInterrupted, 10*i)
			}
		}
	}
	if sp := spendOf(t, s, 1); sp.Tokens != want || sp.Micros != want {
		t.Errorf("spend after settling = %+v, want %d tokens and micros", sp, want)
	}
	checkSpendMatchesLedger(t, s)
	if n, err := s.SettleOpen(bg); err != nil || n != 0 {
		t.Errorf("second SettleOpen = %d, %v; want 0, nil", n, err)
	}
	if sp := spendOf(t, s, 1); sp.Tokens != want {
		t.Errorf("second SettleOpen moved spend to %+v", sp)
	}
}

// TestOpenRowRefreshesWaitForOtherRows pins RefreshInterval: a refresh of an
// open row written already waits for it, and any other row queued takes the
// refreshes along within FlushInterval.
func TestOpenRowRefreshesWaitForOtherRows(t *testing.T) {
	s := openTestStore(t)
	ctx := context.Background()
	w := s.NewLedgerWriter(LedgerConfig{FlushInterval: time.Millisecond, RefreshInterval: time.Hour}, nil)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()

	w.Open(streamRow("a", 1, OutcomeOpen, 10, 1)) // a new open row waits FlushInterval
	waitTxs(t, w, 1)
	w.Open(streamRow("a", 1, OutcomeOpen, 10, 2)) // a refresh: waits RefreshInterval
	time.Sleep(50 * time.Millisecond)
	if n := w.txs.Load(); n != 1 {
		t.Fatalf("%d transactions with only a refresh queued, want it held (1)", n)
	}
	if got := rowByID(t, s, "a"); got.CompletionTokens != 1 {
		t.Errorf("a refresh was written alone: %d tokens, want 1", got.CompletionTokens)
	}
	w.Add(streamRow("b", 1, OutcomeOK, 10, 5)) // a final row takes the refresh along
	waitTxs(t, w, 2)
	if got := rowByID(t, s, "a"); got.Outcome != OutcomeOpen || got.CompletionTokens != 2 {
		t.Errorf("a: %s with %d tokens, want open with the refresh's 2", got.Outcome, got.CompletionTokens)
	}
	// A final row replacing a queued refresh does not wait for it either.
	w.Open(streamRow("a", 1, OutcomeOpen, 10, 3))
	w.Add(streamRow("a", 1, OutcomeOK, 10, 4))
	waitTxs(t, w, 3)
	if got := rowByID(t, s, "a"); got.Outcome != OutcomeOK || got.CompletionTokens != 4 {
		t.Errorf("a: %s with %d tokens, want ok with 4", got.Outcome, got.CompletionTokens)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	checkSpendMatchesLedger(t, s)
}

// waitTxs waits (10 s at most) until w committed n transactions.
func waitTxs(t *testing.T, w *LedgerWriter, n int64) {
	t.Helper()
	for i := 0; w.txs.Load() < n; i++ {
		if i == 1000 {
			t.Fatalf("%d transactions after 10s, want %d", w.txs.Load(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
