package policy

import (
	"context"
	"testing"
)

// BenchmarkAuthenticateAdmitSettle measures the per-request policy work on
// the hot path: a cached key, every limit and both budgets enabled.
func BenchmarkAuthenticateAdmitSettle(b *testing.B) {
	st, _ := openStore(b)
	g := newGate(b, st, Config{Prices: map[string]Price{"m": {InputMicrosPerM: 150_000, OutputMicrosPerM: 600_000}}})
	secret, _ := createKey(b, st, KeyOptions{
		Tenant: "acme", RPM: 1 << 40, TPM: 1 << 40, MaxConcurrency: 1 << 20, Models: []string{"m"},
		BudgetTokens: ptr(1 << 60), BudgetMicros: ptr(1 << 60),
	})
	authenticate(b, g, secret)
	ctx := context.Background()
	r := Request{Model: "m", PromptEstimate: 100, PromptBound: 200, MaxTokens: 256}
	u := Usage{PromptTokens: 100, CompletionTokens: 200}

	b.ReportAllocs()
	for b.Loop() {
		p, err := g.Authenticate(ctx, secret)
		if err != nil {
			b.Fatal(err)
		}
		tk, _, err := g.Admit(p, r)
		if err != nil {
			b.Fatal(err)
		}
		tk.Settle(u)
	}
}

// BenchmarkAuthenticateAdmitSettleParallel is the same path with every
// goroutine using one key, the worst case for lock contention.
func BenchmarkAuthenticateAdmitSettleParallel(b *testing.B) {
	st, _ := openStore(b)
	g := newGate(b, st, Config{})
	secret, _ := createKey(b, st, KeyOptions{Tenant: "acme", RPM: 1 << 40, TPM: 1 << 40, BudgetTokens: ptr(1 << 60)})
	authenticate(b, g, secret)
	r := Request{Model: "m", PromptEstimate: 100, PromptBound: 200, MaxTokens: 256}
	u := Usage{PromptTokens: 100, CompletionTokens: 200}

	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			p, err := g.Authenticate(ctx, secret)
			if err != nil {
				b.Error(err)
				return
			}
			tk, _, err := g.Admit(p, r)
			if err != nil {
				b.Error(err)
				return
			}
			tk.Settle(u)
		}
	})
}

// BenchmarkAdmissionQueueIdle: what the admission queue adds to a request
// while its model is not busy — admitted at once, then released.
func BenchmarkAdmissionQueueIdle(b *testing.B) {
	q := NewQueue(QueueConfig{Capacity: func(string) int64 { return 1 << 20 }})
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s, err := q.Wait(ctx, "m", ClassStandard, 1)
			if err != nil {
				b.Fatal(err)
			}
			s.Release()
		}
	})
}
