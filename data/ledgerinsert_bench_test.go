package data

import (
	"context"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// BenchmarkLedgerInsert is the writer's cost per final row: transactions of
// 50 rows (a batch at about 1000 answers a second), the rows of 4 tenants'
// 16 keys, each row with its attempt log, on SQLite. ns/op is per row.
//
//	go test ./data -run '^$' -bench LedgerInsert -cpu 1 -benchtime 50000x -count 5
func BenchmarkLedgerInsert(b *testing.B) {
	const batch = 50
	s := openTestStore(b)
	row := LedgerRow{
		Model: "meta-llama/Llama-3.1-8B-Instruct", Upstream: "replica-1", Stream: true,
		PromptTokens: 42, CompletionTokens: 128, CostMicros: 170, Status: 200, Outcome: OutcomeOK, Attempts: 1,
		Stages: Stages{Gateway: 300 * time.Microsecond, Connect: -1, UpstreamTTFT: 80 * time.Millisecond,
			EngineQueue: time.Millisecond, EngineTTFT: 70 * time.Millisecond, Network: 9 * time.Millisecond,
			TTFT: 81 * time.Millisecond, Total: 900 * time.Millisecond},
		AttemptLog: []Attempt{{N: 1, Replica: "replica-1", Role: "first", Start: 300 * time.Microsecond,
			TTFT: 80 * time.Millisecond, End: 900 * time.Millisecond, Outcome: AttemptWon, PromptTokens: 42, CompletionTokens: 128}},
	}
	rows := make([]LedgerRow, batch)
	start := time.Now()
	b.ResetTimer()
	insertBatches(b, s, rows, row, start, "req_")
}

// insertBatches inserts b.N copies of row, len(rows) a transaction, each
// with its own id (prefix and its number), a millisecond after the one
// before, spread over 4 tenants and 16 keys.
func insertBatches(b *testing.B, s *Store, rows []LedgerRow, row LedgerRow, start time.Time, prefix string) {
	ctx := context.Background()
	for i := 0; i < b.N; i += len(rows) {
		n := min(len(rows), b.N-i)
		for j := range n {
			k := (i + j) % 16
			rows[j] = row
			rows[j].ID = prefix + strconv.Itoa(i+j)
			rows[j].Time = start.Add(time.Duration(i+j) * time.Millisecond)
			rows[j].TenantID = int64(1 + k%4)
			rows[j].KeyID = fmt.Sprintf("key_%016d", k)
		}
		if err := s.InsertLedger(ctx, rows[:n]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLedgerBatch is the CPU a final row costs the whole process
// (writer and checkpointer; getrusage) by transaction size: 50 rows (a
// FlushInterval of 50 ms at 1000 answers a second) and 200 (the
// LoggedInterval of answers' rows in the commit log). ns/op is per row.
//
//	go test ./data -run '^$' -bench LedgerBatch -cpu 1 -benchtime 20000x -count 6
//	strace -f -c -e trace=pwrite64 ./data.test -test.run '^$' -test.bench 'LedgerBatch/rows=50$' -test.benchtime 20000x
func BenchmarkLedgerBatch(b *testing.B) {
	for _, batch := range []int{50, 200} {
		b.Run(fmt.Sprintf("rows=%d", batch), func(b *testing.B) {
			s := openTestStore(b)
			row := LedgerRow{
				Model: "meta-llama/Llama-3.1-8B-Instruct", Upstream: "replica-1",
				PromptTokens: 42, CompletionTokens: 128, CostMicros: 170, Status: 200, Outcome: OutcomeOK, Attempts: 1,
				Stages: UnknownStages(), Priority: "standard", QueueWait: -1,
				AttemptLog: []Attempt{{N: 1, Replica: "replica-1", Role: "first", Start: 300 * time.Microsecond,
					TTFT: -1, End: 900 * time.Millisecond, Outcome: AttemptWon, PromptTokens: 42, CompletionTokens: 128}},
			}
			rows := make([]LedgerRow, batch)
			start := time.Now()
			cpu := processCPU()
			b.ResetTimer()
			insertBatches(b, s, rows, row, start, "req_b_")
			b.StopTimer()
			b.ReportMetric(float64((processCPU()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/row")
		})
	}
}

// processCPU is the CPU time (user and system) the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
