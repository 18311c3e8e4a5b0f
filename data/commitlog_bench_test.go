package data

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkCommitLogged is an answer's wait for its row with the commit log
// on (a SQLite gateway's every JSON answer and stream end): Commit from
// many goroutines at once, reporting the commit log's writes per answer
// (under 1 once concurrent answers share one) and its system calls per
// answer (with a mapped file, only those that start and end a file and
// fault its pages in, 64 KiB at a time).
//
//	go test ./data -run '^$' -bench CommitLogged -cpu 2 -benchtime 20000x
func BenchmarkCommitLogged(b *testing.B) {
	for _, par := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("parallelism=%d", par), func(b *testing.B) {
			s := openTestStore(b)
			ctx := context.Background()
			w := s.NewLedgerWriter(LedgerConfig{}, nil)
			if _, err := w.OpenCommitLog(ctx); err != nil {
				b.Fatal(err)
			}
			ran := make(chan error, 1)
			go func() { ran <- w.Run(ctx) }()
			row := LedgerRow{
				TenantID: 1, KeyID: "key_0123456789abcdef", Model: "meta-llama/Llama-3.1-8B-Instruct",
				Upstream: "replica-1", PromptTokens: 42, CompletionTokens: 128, CostMicros: 170,
				Status: 200, Outcome: OutcomeOK, Attempts: 1, Stages: UnknownStages(),
			}
			var n atomic.Int64
			b.SetParallelism(par)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				r := row
				for pb.Next() {
					r.ID = fmt.Sprintf("req_%d", n.Add(1))
					r.Time = time.Now()
					if err := w.Commit(ctx, r); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(w.clog.Writes())/float64(b.N), "writes/op")
			b.ReportMetric(float64(w.clog.Syscalls())/float64(b.N), "syscalls/op")
			if err := w.Close(); err != nil {
				b.Fatal(err)
			}
			<-ran
		})
	}
}
