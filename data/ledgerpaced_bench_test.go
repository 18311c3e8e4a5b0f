package data

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"
)

// BenchmarkLedgerPaced is what the ledger costs the process at a steady
// 1000 answers a second (the lead's profiling rate): Commits through the
// commit log from 8 goroutines, paced, with the writer and the
// checkpointer running as in the gateway. cpu-µs/row is the process's CPU
// (getrusage) over the rows; b.N rows take b.N ms. logged= is
// LedgerConfig.LoggedInterval (50ms: as if answers' rows waited
// FlushInterval like any other); logged=0s paces the same goroutines and
// commits nothing: the harness's own cost, to subtract.
//
//	go test ./data -run '^$' -bench LedgerPaced -benchtime 5000x -count 4
func BenchmarkLedgerPaced(b *testing.B) {
	for _, logged := range []time.Duration{0, 50 * time.Millisecond, 200 * time.Millisecond} {
		b.Run(fmt.Sprintf("logged=%v", logged), func(b *testing.B) {
			s := openTestStore(b)
			ctx := context.Background()
			w := s.NewLedgerWriter(LedgerConfig{RefreshInterval: 60 * time.Millisecond, LoggedInterval: logged}, nil)
			if _, err := w.OpenCommitLog(ctx); err != nil {
				b.Fatal(err)
			}
			ran := make(chan error, 1)
			go func() { ran <- w.Run(ctx) }()
			row := LedgerRow{
				TenantID: 1, KeyID: "key_0123456789abcdef", Model: "tailgate-sim", Upstream: "sim-1",
				Endpoint: "/v1/chat/completions", PromptTokens: 24, CompletionTokens: 16, CostMicros: 14,
				Status: 200, Outcome: OutcomeOK, Attempts: 1, Stages: UnknownStages(), Priority: "standard", QueueWait: -1,
				AttemptLog: []Attempt{{N: 1, Replica: "sim-1", Role: "first", TTFT: -1, End: -1, Outcome: AttemptWon,
					PromptTokens: 24, CompletionTokens: 16}},
			}
			const goroutines = 8
			start := time.Now()
			cpu := processCPU()
			b.ResetTimer()
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := row
					for i := g; i < b.N; i += goroutines {
						if d := time.Until(start.Add(time.Duration(i) * time.Millisecond)); d > 0 {
							time.Sleep(d)
						}
						r.ID = "req_p_" + strconv.Itoa(i)
						r.Time = time.Now()
						if logged == 0 {
							continue
						}
						if err := w.Commit(ctx, r); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64((processCPU()-cpu).Nanoseconds())/1e3/float64(b.N), "cpu-µs/row")
			b.ReportMetric(float64(w.txs.Load())/float64(b.N)*1000, "txs/1000rows")
			if logged != 0 {
				b.ReportMetric(float64(w.clog.Writes())/float64(b.N), "log-writes/row")
			}
			if err := w.Close(); err != nil {
				b.Fatal(err)
			}
			<-ran
		})
	}
}
