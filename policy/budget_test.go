package policy

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
)

func TestCostRounding(t *testing.T) {
	st, _ := openStore(t)
	g := newGate(t, st, Config{
		Prices: map[string]Price{
			"cheap":  {InputMicrosPerM: 150_000, OutputMicrosPerM: 600_000}, // $0.15 / $0.60 per M
			"pricey": {InputMicrosPerM: 3_000_000, OutputMicrosPerM: 15_000_000},
			"huge":   {InputMicrosPerM: math.MaxInt64, OutputMicrosPerM: math.MaxInt64},
		},
		DefaultPrice: Price{InputMicrosPerM: 1_000_000, OutputMicrosPerM: 2_000_000},
	})
	for _, c := range []struct {
		model string
		u     Usage
		want  int64
	}{
		{"cheap", Usage{}, 0},
		{"cheap", Usage{PromptTokens: 1}, 0},                        // 0.15 rounds down
		{"cheap", Usage{PromptTokens: 3}, 0},                        // 0.45 rounds down
		{"cheap", Usage{PromptTokens: 4}, 1},                        // 0.6 rounds up
		{"cheap", Usage{CompletionTokens: 1}, 1},                    // 0.6 rounds up
		{"cheap", Usage{PromptTokens: 10, CompletionTokens: 10}, 8}, // 7.5: halves round up
		{"cheap", Usage{PromptTokens: 1_000_000, CompletionTokens: 0}, 150_000},
		{"pricey", Usage{PromptTokens: 1000, CompletionTokens: 500}, 10_500},
		{"pricey", Usage{PromptTokens: 1, CompletionTokens: 0}, 3},
		{"unlisted", Usage{PromptTokens: 1, CompletionTokens: 1}, 3},                     // default price
		{"unlisted", Usage{PromptTokens: -5, CompletionTokens: 1}, 2},                    // negative counts as zero
		{"huge", Usage{PromptTokens: math.MaxInt64, CompletionTokens: 1}, math.MaxInt64}, // saturates
	} {
		if got := g.Cost(c.model, c.u); got != c.want {
			t.Errorf("Cost(%s, %+v) = %d, want %d", c.model, c.u, got, c.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for name, c := range map[string]Config{
		"poll":    {PollInterval: -1},
		"cache":   {CacheSize: -1},
		"default": {DefaultPrice: Price{InputMicrosPerM: -1}},
		"model":   {Prices: map[string]Price{"m": {OutputMicrosPerM: -1}}},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	st, _ := openStore(t)
	if _, err := New(context.Background(), Config{PollInterval: -1}, st, nil); err == nil {
		t.Error("New accepted a bad config")
	}
}

// TestBudgetNeverExceededUnderConcurrency is the central invariant: many
// requests admitted and settled at once never bill a tenant past its
// budget, and every reservation is released exactly once.
func TestBudgetNeverExceededUnderConcurrency(t *testing.T) {
	const (
		budget  = 20_000
		workers = 200
		rounds  = 40
	)
	st, _ := openStore(t)
	g := newGate(t, st, Config{Prices: map[string]Price{"m": {InputMicrosPerM: 1_000_000, OutputMicrosPerM: 3_000_000}}})
	secret, _ := createKey(t, st, KeyOptions{Tenant: "acme", BudgetTokens: ptr(budget), BudgetMicros: ptr(2 * budget)})
	p := authenticate(t, g, secret)

	var (
		settledTokens, settledMicros, admitted, rejected atomic.Int64
		wg                                               sync.WaitGroup
		stop                                             = make(chan struct{})
		watch                                            sync.WaitGroup
	)
	// A watcher checks the invariant while the workers run.
	watch.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			spent, reserved := g.TenantState(p.TenantID)
			if spent.Tokens+reserved.Tokens > budget || spent.Micros+reserved.Micros > 2*budget {
				t.Errorf("spent %+v + reserved %+v exceed the budget", spent, reserved)
				return
			}
		}
	})
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range rounds {
				r := Request{Model: "m", PromptEstimate: 20, PromptBound: 30 + rng.Int64N(30), MaxTokens: 1 + rng.Int64N(40)}
				tk, _, err := g.Admit(p, r)
				if err != nil {
					var qe *QuotaError
					if !errors.As(err, &qe) {
						t.Errorf("Admit: %v", err)
						return
					}
					rejected.Add(1)
					continue
				}
				admitted.Add(1)
				switch rng.IntN(4) {
				case 0: // consumed nothing
					tk.Release()
				case 1: // settled twice at once: counted once
					u := Usage{PromptTokens: r.PromptBound, CompletionTokens: r.MaxTokens}
					var c [2]int64
					var both sync.WaitGroup
					for i := range c {
						both.Go(func() { c[i] = tk.Settle(u) })
					}
					both.Wait()
					if c[0] != c[1] {
						t.Errorf("two Settles returned %d and %d", c[0], c[1])
					}
					settledTokens.Add(u.PromptTokens + u.CompletionTokens)
					settledMicros.Add(c[0])
				default: // actual usage within the reservation
					u := Usage{PromptTokens: rng.Int64N(r.PromptBound + 1), CompletionTokens: rng.Int64N(r.MaxTokens + 1)}
					settledTokens.Add(u.PromptTokens + u.CompletionTokens)
					settledMicros.Add(tk.Settle(u))
					tk.Release() // no-op after Settle
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	watch.Wait()

	spent, reserved := g.TenantState(p.TenantID)
	if reserved != (data.Spend{}) {
		t.Fatalf("reserved %+v after every ticket settled, want zero", reserved)
	}
	if spent.Tokens != settledTokens.Load() || spent.Micros != settledMicros.Load() {
		t.Fatalf("spent %+v, settled %d tokens / %d micros", spent, settledTokens.Load(), settledMicros.Load())
	}
	if spent.Tokens > budget || spent.Micros > 2*budget {
		t.Fatalf("spent %+v past the budget", spent)
	}
	if rejected.Load() == 0 || admitted.Load() == 0 {
		t.Fatalf("admitted %d, rejected %d: the budget was not contended", admitted.Load(), rejected.Load())
	}
}

func TestMoneyBudget(t *testing.T) {
	st, _ := openStore(t)
	g := newGate(t, st, Config{Prices: map[string]Price{
		"big":   {InputMicrosPerM: 10_000_000, OutputMicrosPerM: 30_000_000}, // 10 / 30 micros per token
		"small": {InputMicrosPerM: 1_000_000, OutputMicrosPerM: 1_000_000},
	}})
	secret, _ := createKey(t, st, KeyOptions{Tenant: "acme", BudgetMicros: ptr(5000)})
	p := authenticate(t, g, secret)

	// 100·10 + 100·30 = 4000 micros reserved; 2000 more would not fit.
	r := Request{Model: "big", PromptEstimate: 80, PromptBound: 100, MaxTokens: 100}
	tk, _, err := g.Admit(p, r)
	if err != nil {
		t.Fatal(err)
	}
	if _, reserved := g.TenantState(p.TenantID); reserved.Micros != 4000 || reserved.Tokens != 200 {
		t.Fatalf("reserved %+v, want 200 tokens / 4000 micros", reserved)
	}
	_, _, err = g.Admit(p, Request{Model: "big", PromptBound: 50, MaxTokens: 50})
	var qe *QuotaError
	if !errors.As(err, &qe) || qe.Budget != "cost" || qe.Tenant != "acme" {
		t.Fatalf("err = %v, want cost quota", err)
	}
	if strings.Contains(err.Error(), secret[:11]) {
		t.Fatal("quota error names the key")
	}
	// The same tokens on a cheaper model fit.
	tk2, _, err := g.Admit(p, Request{Model: "small", PromptBound: 50, MaxTokens: 50})
	if err != nil {
		t.Fatal(err)
	}
	if c := tk.Settle(Usage{PromptTokens: 90, CompletionTokens: 20}); c != 1500 {
		t.Fatalf("cost %d, want 1500", c)
	}
	if c := tk2.Settle(Usage{PromptTokens: 50, CompletionTokens: 50}); c != 100 {
		t.Fatalf("cost %d, want 100", c)
	}
	if spent, reserved := g.TenantState(p.TenantID); spent.Micros != 1600 || spent.Tokens != 210 || reserved != (data.Spend{}) {
		t.Fatalf("spent %+v reserved %+v", spent, reserved)
	}
	// 1600 + 3400 = 5000 fits exactly; one micro more does not.
	tk3, _, err := g.Admit(p, Request{Model: "small", PromptBound: 3000, MaxTokens: 400})
	if err != nil {
		t.Fatalf("exact fit: %v", err)
	}
	defer tk3.Release()
	if _, _, err := g.Admit(p, Request{Model: "small", MaxTokens: 1}); !errors.As(err, &qe) {
		t.Fatalf("err = %v, want quota", err)
	}
}

func TestSpendReloadedFromLedger(t *testing.T) {
	ctx := context.Background()
	st, _ := openStore(t)
	secret, k := createKey(t, st, KeyOptions{Tenant: "acme", BudgetTokens: ptr(1000)})
	_, other := createKey(t, st, KeyOptions{Tenant: "other"})
	rows := []data.LedgerRow{
		{ID: "r1", TenantID: k.Tenant.ID, KeyID: k.ID, Model: "m", PromptTokens: 300, CompletionTokens: 200, CostMicros: 70, Stages: data.UnknownStages()},
		{ID: "r2", TenantID: k.Tenant.ID, KeyID: k.ID, Model: "m", PromptTokens: 100, CompletionTokens: 50, CostMicros: 5, Stages: data.UnknownStages()},
		{ID: "r3", TenantID: other.Tenant.ID, KeyID: other.ID, Model: "m", PromptTokens: 1, CompletionTokens: 1, CostMicros: 1, Stages: data.UnknownStages()},
		{ID: "r4", Model: "m", Outcome: "rejected", Stages: data.UnknownStages()},
	}
	if err := st.InsertLedger(ctx, rows); err != nil {
		t.Fatal(err)
	}

	g := newGate(t, st, Config{})
	if spent, _ := g.TenantState(k.Tenant.ID); spent != (data.Spend{Tokens: 650, Micros: 75}) {
		t.Fatalf("acme spent %+v, want 650 tokens / 75 micros", spent)
	}
	if spent, _ := g.TenantState(other.Tenant.ID); spent != (data.Spend{Tokens: 2, Micros: 1}) {
		t.Fatalf("other spent %+v", spent)
	}
	// 650 spent: 350 more fit, 351 do not.
	p := authenticate(t, g, secret)
	var qe *QuotaError
	if _, _, err := g.Admit(p, Request{Model: "m", PromptBound: 300, MaxTokens: 51}); !errors.As(err, &qe) {
		t.Fatalf("err = %v, want quota", err)
	}
	tk, _, err := g.Admit(p, Request{Model: "m", PromptBound: 300, MaxTokens: 50})
	if err != nil {
		t.Fatal(err)
	}
	tk.Release()
}

func TestBudgetChangePickedUpByRun(t *testing.T) {
	ctx := context.Background()
	st, path := openStore(t)
	g := newGate(t, st, Config{PollInterval: 20 * time.Millisecond})
	runGate(t, g)
	secret, k := createKey(t, st, KeyOptions{Tenant: "acme"})
	p := authenticate(t, g, secret)
	r := Request{Model: "m", PromptBound: 60, MaxTokens: 50}
	tk, _, err := g.Admit(p, r)
	if err != nil {
		t.Fatalf("unlimited tenant: %v", err)
	}
	tk.Settle(Usage{PromptTokens: 50, CompletionTokens: 10})

	cli := openSecond(t, path)
	if err := cli.SetTenantBudget(ctx, k.Tenant.ID, 100, 0); err != nil {
		t.Fatal(err)
	}
	within(t, time.Second, "budget applied", func() bool {
		p := authenticate(t, g, secret)
		tk, _, err := g.Admit(p, r)
		if err == nil {
			tk.Release()
			return false
		}
		var qe *QuotaError
		return errors.As(err, &qe)
	})
	// 60 spent, so 40 still fit.
	tk, _, err = g.Admit(authenticate(t, g, secret), Request{Model: "m", PromptBound: 20, MaxTokens: 20})
	if err != nil {
		t.Fatal(err)
	}
	tk.Release()
}

// TestQuotaErrorAmounts: a refusal carries the budget, what is spent and
// reserved, and the request's worst case, so it can say "larger than what
// is left" apart from "used up".
func TestQuotaErrorAmounts(t *testing.T) {
	st, _ := openStore(t)
	g := newGate(t, st, Config{})
	secret, _ := createKey(t, st, KeyOptions{Tenant: "acme", BudgetTokens: ptr(300)})
	p := authenticate(t, g, secret)

	// Nothing spent, but the worst case is larger than the budget.
	_, _, err := g.Admit(p, Request{PromptBound: 100, MaxTokens: 1000})
	var qe *QuotaError
	if !errors.As(err, &qe) {
		t.Fatalf("err = %v, want a QuotaError", err)
	}
	if want := (QuotaError{Tenant: "acme", Budget: "tokens", Limit: 300, Requested: 1100}); *qe != want {
		t.Fatalf("QuotaError %+v, want %+v", *qe, want)
	}
	if qe.Left() != 300 || qe.UsedUp() {
		t.Fatalf("left %d, used up %v; want 300 left", qe.Left(), qe.UsedUp())
	}

	// A request in flight holds all of it: used up, by its reservation.
	tk, _, err := g.Admit(p, Request{PromptBound: 100, MaxTokens: 200})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = g.Admit(p, Request{PromptBound: 1, MaxTokens: 1})
	if !errors.As(err, &qe) {
		t.Fatalf("err = %v, want a QuotaError", err)
	}
	if qe.Reserved != 300 || qe.Spent != 0 || qe.Requested != 2 || !qe.UsedUp() {
		t.Fatalf("QuotaError %+v, want 300 reserved, 2 requested, used up", *qe)
	}
	tk.Settle(Usage{PromptTokens: 10, CompletionTokens: 20})
	_, _, err = g.Admit(p, Request{PromptBound: 100, MaxTokens: 200})
	if !errors.As(err, &qe) || qe.Spent != 30 || qe.Reserved != 0 || qe.Left() != 270 {
		t.Fatalf("after settling: %v, want 30 spent, 270 left", err)
	}
}
