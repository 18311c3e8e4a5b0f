package data

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

func TestCommitSharesOneTransactionAmongConcurrentCallers(t *testing.T) {
	const callers = 64
	path := filepath.Join(t.TempDir(), "tailgate.db")
	s := openAt(t, path)
	other := openAt(t, path) // another process holding the write lock
	ctx := context.Background()
	// An hour-long interval: only the group commit can get rows out.
	w := s.NewLedgerWriter(LedgerConfig{FlushInterval: time.Hour}, nil)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()

	lock, err := other.write.BeginTx(ctx, nil) // BEGIN IMMEDIATE
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(`UPDATE meta SET v = v WHERE k = 'keys_version'`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	commit := func(i int) {
		defer wg.Done()
		id := fmt.Sprintf("c-%d", i)
		if err := w.Commit(ctx, streamRow(id, 1, OutcomeOK, 1, 1)); err != nil {
			t.Errorf("Commit %s: %v", id, err)
			return
		}
		if n := countRowsWithID(t, s, id); n != 1 {
			t.Errorf("row %s: %d stored when its Commit returned, want 1", id, n)
		}
	}
	// The first row's transaction waits on the lock; every other caller
	// queues behind it meanwhile.
	wg.Add(1)
	go commit(0)
	testkit.WaitFor(t, "the first commit holding the lock", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.held == 1 && len(w.queue) == 0
	})
	for i := 1; i < callers; i++ {
		wg.Add(1)
		go commit(i)
	}
	testkit.WaitFor(t, "every caller queued", func() bool { return w.Backlog() == callers })
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if n := w.txs.Load(); n != 2 {
		t.Errorf("%d callers took %d transactions, want 2 (the first alone, then all others together)", callers, n)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
}

func TestCommitHonoursContextAndCommitWaitAndKeepsTheRow(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		w := s.NewLedgerWriter(LedgerConfig{}, nil) // not running: nothing commits
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if err := w.Commit(ctx, streamRow("r", 1, OutcomeOK, 1, 1)); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Commit with an expired context = %v, want DeadlineExceeded", err)
		}
		// The writer's own bound, for a caller whose context never ends.
		w.cfg.CommitWait = 10 * time.Millisecond
		if err := w.Commit(context.Background(), streamRow("r2", 1, OutcomeOK, 1, 1)); !errors.Is(err, ErrCommitWait) {
			t.Errorf("Commit past CommitWait = %v, want ErrCommitWait", err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"r", "r2"} {
			if n := countRowsWithID(t, s, id); n != 1 {
				t.Errorf("row of a timed-out Commit stored %d times after Close, want 1", n)
			}
		}
		// After Close, Commit writes the row itself.
		if err := w.Commit(context.Background(), streamRow("late", 1, OutcomeOK, 1, 1)); err != nil {
			t.Errorf("Commit after Close: %v", err)
		}
		if n := countRowsWithID(t, s, "late"); n != 1 {
			t.Errorf("row committed after Close stored %d times, want 1", n)
		}
	})
}

// BenchmarkLedgerCommit measures what a caller waits for its row: Commit
// (until the group transaction holding it committed) against Add (queued,
// written later) and against a transaction of its own per row, with 1, 16
// and 64 concurrent callers. The ratios are the result; absolute times vary
// with the disk.
//
//	go test ./data -run '^$' -bench LedgerCommit -benchtime 2000x
func BenchmarkLedgerCommit(b *testing.B) {
	for _, callers := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			s := openTestStore(b)
			w := s.NewLedgerWriter(LedgerConfig{}, nil)
			ran := make(chan error, 1)
			go func() { ran <- w.Run(context.Background()) }()
			ctx := context.Background()
			modes := []struct {
				name string
				op   func(r LedgerRow) error
			}{
				{"commit", func(r LedgerRow) error { return w.Commit(ctx, r) }},
				{"add", func(r LedgerRow) error { w.Add(r); return nil }},
				{"tx-per-row", func(r LedgerRow) error { return s.InsertLedger(ctx, []LedgerRow{r}) }},
			}
			b.ResetTimer()
			var p50 [3]time.Duration
			for m, mode := range modes {
				txs := w.txs.Load()
				lat := runCallers(b, callers, b.N, mode.name, mode.op)
				if mode.name == "commit" {
					b.ReportMetric(float64(b.N)/float64(w.txs.Load()-txs), "rows/tx")
				}
				if err := w.Flush(ctx); err != nil {
					b.Fatal(err)
				}
				p50[m] = lat[len(lat)/2]
				b.ReportMetric(float64(p50[m].Nanoseconds())/1e3, mode.name+"-p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, mode.name+"-p99-µs")
			}
			b.ReportMetric(float64(p50[0])/float64(p50[1]), "commit/add")
			b.ReportMetric(float64(p50[0])/float64(p50[2]), "commit/tx-per-row")
			b.StopTimer()
			if err := w.Close(); err != nil {
				b.Fatal(err)
			}
			<-ran
		})
	}
}

// runCallers runs n ops spread over callers goroutines and returns every
// op's latency, sorted.
func runCallers(b *testing.B, callers, n int, name string, op func(LedgerRow) error) []time.Duration {
	row := LedgerRow{
		TenantID: 1, KeyID: "key_0123456789abcdef", Model: "meta-llama/Llama-3.1-8B-Instruct",
		Upstream: "replica-1", Stream: true, PromptTokens: 42, CompletionTokens: 128, CostMicros: 170,
		Status: 200, Outcome: OutcomeOK, Attempts: 1,
		Stages: Stages{Gateway: 300 * time.Microsecond, Connect: -1, UpstreamTTFT: 80 * time.Millisecond,
			EngineQueue: time.Millisecond, EngineTTFT: 70 * time.Millisecond, Network: 9 * time.Millisecond,
			TTFT: 81 * time.Millisecond, Total: 900 * time.Millisecond},
	}
	lats := make([][]time.Duration, callers)
	var wg sync.WaitGroup
	for g := range callers {
		k := n / callers
		if g < n%callers {
			k++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := row
			l := make([]time.Duration, 0, k)
			for i := range k {
				r.ID = fmt.Sprintf("%s-%d-%d", name, g, i)
				r.Time = time.Now()
				if err := op(r); err != nil {
					b.Error(err)
					return
				}
				l = append(l, time.Since(r.Time))
			}
			lats[g] = l
		}()
	}
	wg.Wait()
	all := slices.Concat(lats...)
	if len(all) == 0 {
		b.Fatal("no latencies")
	}
	slices.Sort(all)
	return all
}

// TestSmallLedgerTransactionAllocatesForItsRows: the group commit's
// transactions are mostly a row or a few, and each one's garbage is paid
// for by the requests waiting on it; a one-row insert once allocated the
// arguments of the largest statement (64 rows, 26 KiB) every time.
func TestSmallLedgerTransactionAllocatesForItsRows(t *testing.T) {
	s := openTestStore(t)
	ctx := context.Background()
	row := LedgerRow{TenantID: 1, KeyID: "key_0123456789abcdef", Model: "m", Upstream: "replica-1",
		PromptTokens: 42, CompletionTokens: 128, CostMicros: 170, Status: 200, Outcome: OutcomeOK, Attempts: 1,
		Stages: UnknownStages()}
	const runs = 50
	insert := func(i int) {
		row.ID = fmt.Sprintf("alloc-%d", i)
		if err := s.InsertLedger(ctx, []LedgerRow{row}); err != nil {
			t.Fatal(err)
		}
	}
	insert(-1) // statements and connection warm
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range runs {
		insert(i)
	}
	runtime.ReadMemStats(&after)
	per := (after.TotalAlloc - before.TotalAlloc) / runs
	t.Logf("one-row transaction: %d bytes allocated", per)
	if per > 12<<10 {
		t.Errorf("a one-row ledger transaction allocates %d bytes, want at most 12 KiB", per)
	}
}
