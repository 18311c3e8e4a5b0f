package data

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// countIDs returns how many times each ledger id is stored, read through a
// fresh Store so that nothing cached in the writer's handle can help.
func countIDs(t *testing.T, path string) map[string]int {
	t.Helper()
	s := openAt(t, path)
	rows, err := s.LedgerRows(context.Background(), UsageFilter{})
	if err != nil {
		t.Fatal(err)
	}
	n := make(map[string]int, len(rows))
	for _, r := range rows {
		n[r.ID]++
	}
	return n
}

func checkExactlyOnce(t *testing.T, got map[string]int, want int) {
	t.Helper()
	if len(got) != want {
		t.Errorf("%d distinct rows stored, want %d", len(got), want)
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("row %s stored %d times", id, n)
		}
	}
}

func TestLedgerWriterWritesEveryRowOnce(t *testing.T) {
	const writers, perWriter = 16, 250
	for _, tc := range []struct {
		name string
		cfg  LedgerConfig
		// stop ends the writer: it is given Run's cancel func and the
		// channel Run's result arrives on (nil if Run never started).
		stop       func(t *testing.T, w *LedgerWriter, cancel context.CancelFunc, ran <-chan error)
		startRun   bool
		concurrent bool // Add concurrently with the stop
	}{
		{
			name: "close drains a running writer", startRun: true,
			cfg: LedgerConfig{BatchSize: 64, FlushInterval: time.Millisecond, Buffer: 128},
			stop: func(t *testing.T, w *LedgerWriter, _ context.CancelFunc, ran <-chan error) {
				if err := w.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				if err := <-ran; err != nil {
					t.Errorf("Run: %v", err)
				}
			},
		},
		{
			name: "cancelling Run drains", startRun: true,
			cfg: LedgerConfig{BatchSize: 7, FlushInterval: time.Hour, Buffer: 8},
			stop: func(t *testing.T, w *LedgerWriter, cancel context.CancelFunc, ran <-chan error) {
				cancel()
				if err := <-ran; err != nil {
					t.Errorf("Run: %v", err)
				}
				if err := w.Close(); err != nil {
					t.Errorf("Close after Run returned: %v", err)
				}
			},
		},
		{
			name: "close without Run drains synchronously",
			cfg:  LedgerConfig{Buffer: writers * perWriter},
			stop: func(t *testing.T, w *LedgerWriter, _ context.CancelFunc, _ <-chan error) {
				if err := w.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			},
		},
		{
			name: "adds racing close are written", startRun: true, concurrent: true,
			cfg: LedgerConfig{BatchSize: 16, FlushInterval: time.Millisecond, Buffer: 4},
			stop: func(t *testing.T, w *LedgerWriter, _ context.CancelFunc, ran <-chan error) {
				if err := w.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				if err := w.Close(); err != nil {
					t.Errorf("second Close: %v", err)
				}
				if err := <-ran; err != nil {
					t.Errorf("Run: %v", err)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tailgate.db")
			s, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			w := s.NewLedgerWriter(tc.cfg, nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var ran chan error
			if tc.startRun {
				ran = make(chan error, 1)
				go func() { ran <- w.Run(ctx) }()
			}

			var wg sync.WaitGroup
			for g := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range perWriter {
						w.Add(LedgerRow{ID: fmt.Sprintf("r-%d-%d", g, i), TenantID: 1, Model: "m", Stages: UnknownStages()})
					}
				}()
			}
			if tc.concurrent {
				time.Sleep(time.Millisecond)
				tc.stop(t, w, cancel, ran)
				wg.Wait()
			} else {
				wg.Wait()
				tc.stop(t, w, cancel, ran)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			checkExactlyOnce(t, countIDs(t, path), writers*perWriter)
		})
	}
}

func TestLedgerWriterFlush(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		// An hour-long interval and huge batches: only Flush can get rows out.
		w := s.NewLedgerWriter(LedgerConfig{BatchSize: 1 << 20, FlushInterval: time.Hour}, nil)
		ran := make(chan error, 1)
		runCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { ran <- w.Run(runCtx) }()

		for round, n := range []int{1, 10, 0, 1000} {
			for i := range n {
				w.Add(LedgerRow{ID: fmt.Sprintf("r-%d-%d", round, i), Stages: UnknownStages()})
			}
			if err := w.Flush(ctx); err != nil {
				t.Fatalf("Flush: %v", err)
			}
			rows, err := s.LedgerRows(ctx, UsageFilter{})
			if err != nil {
				t.Fatal(err)
			}
			want := 0
			for _, m := range []int{1, 10, 0, 1000}[:round+1] {
				want += m
			}
			if len(rows) != want {
				t.Fatalf("after Flush in round %d: %d rows, want %d", round, len(rows), want)
			}
		}

		// Concurrent Flushes each return once their rows are in.
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("c-%d", g)
				w.Add(LedgerRow{ID: id, Stages: UnknownStages()})
				if err := w.Flush(ctx); err != nil {
					t.Errorf("Flush: %v", err)
					return
				}
				if n := countRowsWithID(t, s, id); n != 1 {
					t.Errorf("row %s: %d stored after its Flush, want 1", id, n)
				}
			}()
		}
		wg.Wait()

		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-ran; err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(ctx); err != nil {
			t.Errorf("Flush after Close: %v", err)
		}
		// After Close, Add writes synchronously.
		w.Add(LedgerRow{ID: "late", Stages: UnknownStages()})
		if n := countRowsWithID(t, s, "late"); n != 1 {
			t.Errorf("row added after Close stored %d times, want 1", n)
		}
	})
}

func TestLedgerWriterFlushHonoursContextWhenNotRunning(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		w := s.NewLedgerWriter(LedgerConfig{}, nil)
		w.Add(LedgerRow{ID: "r", Stages: UnknownStages()})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if err := w.Flush(ctx); err == nil {
			t.Error("Flush without Run returned nil before the row was written")
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if n := countRowsWithID(t, s, "r"); n != 1 {
			t.Errorf("row stored %d times after Close, want 1", n)
		}
	})
}

func countRowsWithID(t *testing.T, s *Store, id string) int {
	t.Helper()
	var n int
	if err := s.read.QueryRow(`SELECT COUNT(*) FROM ledger WHERE id = ?`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// recorder is a slog handler that keeps every record's message.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

func (r *recorder) count(msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

func TestLedgerWriterKeepsRowsThroughWriteErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tailgate.db")
	s := openAt(t, path)
	admin := openAt(t, path) // another process breaking and mending the table
	ctx := context.Background()
	if _, err := admin.write.Exec(`CREATE TRIGGER fail_ledger BEFORE INSERT ON ledger BEGIN SELECT RAISE(ABORT, 'disk on fire'); END`); err != nil {
		t.Fatal(err)
	}

	rec := &recorder{}
	w := s.NewLedgerWriter(LedgerConfig{BatchSize: 10, FlushInterval: time.Millisecond}, slog.New(rec))
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()
	for i := range 100 {
		w.Add(LedgerRow{ID: fmt.Sprintf("r-%d", i), TenantID: 1, PromptTokens: 1, Stages: UnknownStages()})
	}
	for rec.count("ledger write failed, retrying; rows are kept") == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // several more failed attempts
	if _, err := admin.write.Exec(`DROP TRIGGER fail_ledger`); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if n := rec.count("ledger write failed, retrying; rows are kept"); n != 1 {
		t.Errorf("failure logged %d times in one streak, want 1", n)
	}
	if n := rec.count("ledger writes recovered"); n != 1 {
		t.Errorf("recovery logged %d times, want 1", n)
	}
	s.Close()
	got := countIDs(t, path)
	checkExactlyOnce(t, got, 100)
	sp, err := admin.TenantSpend(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sp[1].Tokens != 100 {
		t.Errorf("spend after retries = %d tokens, want 100", sp[1].Tokens)
	}
}

func TestLedgerWriterGivesUpOnlyAfterDrainTimeout(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		breakLedger(t, s)
		w := s.NewLedgerWriter(LedgerConfig{DrainTimeout: 30 * time.Millisecond}, nil)
		w.Add(LedgerRow{ID: "doomed", Stages: UnknownStages()})
		if err := w.Close(); err == nil {
			t.Error("Close reported success for a row it could not write")
		}
	})
}

func TestLedgerWriterAddAfterStoreCloseDoesNotHang(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		w := s.NewLedgerWriter(LedgerConfig{DrainTimeout: time.Hour}, nil)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		s.Close()
		done := make(chan struct{})
		go func() {
			w.Add(LedgerRow{ID: "straggler", Stages: UnknownStages()})
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Add after the store closed is still retrying")
		}
	})
}

func BenchmarkLedgerWriter(b *testing.B) {
	for _, par := range []int{1, 64} {
		b.Run(fmt.Sprintf("adders=%d", par), func(b *testing.B) {
			s := openTestStore(b)
			w := s.NewLedgerWriter(LedgerConfig{}, nil)
			ran := make(chan error, 1)
			go func() { ran <- w.Run(context.Background()) }()
			row := LedgerRow{
				TenantID: 1, KeyID: "key_0123456789abcdef", Model: "meta-llama/Llama-3.1-8B-Instruct",
				Upstream: "replica-1", Stream: true, PromptTokens: 42, CompletionTokens: 128, CostMicros: 170,
				Status: 200, Outcome: "ok", Attempts: 1,
				Stages: Stages{Gateway: 300 * time.Microsecond, Connect: -1, UpstreamTTFT: 80 * time.Millisecond,
					EngineQueue: time.Millisecond, EngineTTFT: 70 * time.Millisecond, Network: 9 * time.Millisecond,
					TTFT: 81 * time.Millisecond, Total: 900 * time.Millisecond},
				// The common request: one attempt, the winner.
				AttemptLog: []Attempt{{N: 1, Replica: "replica-1", Role: "first", Start: 300 * time.Microsecond,
					TTFT: 80 * time.Millisecond, End: 900 * time.Millisecond, Outcome: AttemptWon, PromptTokens: 42, CompletionTokens: 128}},
			}
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			per := b.N / par
			for g := range par {
				n := per
				if g == 0 {
					n += b.N % par
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := row
					for i := range n {
						r.ID = fmt.Sprintf("req-%d-%d", g, i)
						r.Time = time.Now()
						w.Add(r)
					}
				}()
			}
			wg.Wait()
			if err := w.Flush(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "rows/s")
			b.StopTimer()
			if err := w.Close(); err != nil {
				b.Fatal(err)
			}
			<-ran
		})
	}
}

// breakLedger makes every insert into the ledger fail, with a trigger in the
// engine's own syntax.
func breakLedger(t *testing.T, s *Store) {
	t.Helper()
	q := `CREATE TRIGGER fail_ledger BEFORE INSERT ON ledger BEGIN SELECT RAISE(ABORT, 'broken'); END`
	if s.Postgres() {
		q = `CREATE FUNCTION fail_ledger() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'broken'; END $$;
			CREATE TRIGGER fail_ledger BEFORE INSERT ON ledger FOR EACH ROW EXECUTE FUNCTION fail_ledger()`
	}
	if _, err := s.write.Exec(q); err != nil {
		t.Fatal(err)
	}
}
