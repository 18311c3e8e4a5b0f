package data

import (
	"context"
	"fmt"
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
	ctx := context.Background()
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
	for i := 0; i < b.N; i += batch {
		n := min(batch, b.N-i)
		for j := range n {
			k := (i + j) % 16
			rows[j] = row
			rows[j].ID = fmt.Sprintf("req_%d", i+j)
			rows[j].Time = start.Add(time.Duration(i+j) * time.Millisecond)
			rows[j].TenantID = int64(1 + k%4)
			rows[j].KeyID = fmt.Sprintf("key_%016d", k)
		}
		if err := s.InsertLedger(ctx, rows[:n]); err != nil {
			b.Fatal(err)
		}
	}
}
