package policy

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/data/pgtest"
)

// budgetEngines are the two ways a budget is booked: in this process's
// memory (SQLite) and in a database gateways share (PostgreSQL).
var budgetEngines = []struct {
	name string
	open func(testing.TB) *data.Store
}{
	{"sqlite", func(tb testing.TB) *data.Store { st, _ := openStore(tb); return st }},
	{"postgres", func(tb testing.TB) *data.Store { return openSecond(tb, pgtest.NewDatabase(tb)) }},
}

// settleAndBill settles tk with usage and writes its ledger row at the
// request's time, as the server does.
func settleAndBill(t *testing.T, st *data.Store, p *Principal, tk *Ticket, at time.Time, u Usage) {
	t.Helper()
	c := tk.Settle(u)
	row := data.LedgerRow{Time: at, TenantID: p.TenantID, KeyID: p.KeyID, Model: "m", PromptTokens: u.PromptTokens,
		CompletionTokens: u.CompletionTokens, CostMicros: c, Status: 200, Outcome: data.OutcomeOK, Stages: data.UnknownStages()}
	if err := st.InsertLedger(context.Background(), []data.LedgerRow{row}); err != nil {
		t.Fatal(err)
	}
}

func monthly() *string { p := data.PeriodMonthly; return &p }

// A monthly budget used up on the last day of a month is whole again at
// the first instant of the next: the refusal says when, and so do the
// rate-limit state's headers.
func TestPeriodicBudgetResetsAtBoundary(t *testing.T) {
	for _, e := range budgetEngines {
		t.Run(e.name, func(t *testing.T) {
			st := e.open(t)
			clk := newClock()
			clk.t = time.Date(2026, 11, 30, 23, 59, 0, 0, time.UTC)
			dec1 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
			secret, _ := createKey(t, st, KeyOptions{Tenant: "acme", BudgetTokens: ptr(1000), BudgetPeriod: monthly()})
			g := newGate(t, st, Config{Now: clk.Now})
			p := authenticate(t, g, secret)
			req := Request{Model: "m", PromptBound: 500, MaxTokens: 100}
			tk, rs, err := g.Admit(p, req)
			if err != nil {
				t.Fatal(err)
			}
			if !rs.BudgetResets.Equal(dec1) {
				t.Fatalf("budget resets %v, want %v", rs.BudgetResets, dec1)
			}
			settleAndBill(t, st, p, tk, clk.Now(), Usage{PromptTokens: 500, CompletionTokens: 100})
			_, rs, err = g.Admit(p, req)
			var qe *QuotaError
			if !errors.As(err, &qe) {
				t.Fatalf("second 600 tokens of a 1000-token month: %v, want a QuotaError", err)
			}
			if qe.Period != data.PeriodMonthly || !qe.ResetsAt.Equal(dec1) || !rs.BudgetResets.Equal(dec1) {
				t.Fatalf("refusal %+v (headers' reset %v), want monthly, resetting at %v", qe, rs.BudgetResets, dec1)
			}
			if want := "; it resets at 2026-12-01T00:00:00Z"; qe.ResetNote() != want {
				t.Fatalf("reset note %q, want %q", qe.ResetNote(), want)
			}
			clk.Advance(59 * time.Second) // 23:59:59.000
			if _, _, err := g.Admit(p, req); !errors.As(err, &qe) {
				t.Fatalf("a second before the boundary: %v, want a QuotaError", err)
			}
			clk.Advance(time.Second) // 00:00:00.000 on December 1
			tk, rs, err = g.Admit(p, req)
			if err != nil {
				t.Fatalf("at the boundary: %v, want admitted", err)
			}
			if want := dec1.AddDate(0, 1, 0); !rs.BudgetResets.Equal(want) {
				t.Fatalf("December's budget resets %v, want %v", rs.BudgetResets, want)
			}
			tk.Release()
		})
	}
}

// A request admitted before the boundary and settled after it counts where
// its ledger row says — in the month it was made — and its reservation
// holds December's budget only while it is in flight.
func TestPeriodicBudgetRequestAcrossBoundary(t *testing.T) {
	for _, e := range budgetEngines {
		t.Run(e.name, func(t *testing.T) {
			st := e.open(t)
			clk := newClock()
			clk.t = time.Date(2026, 11, 30, 23, 59, 30, 0, time.UTC)
			secret, _ := createKey(t, st, KeyOptions{Tenant: "acme", BudgetTokens: ptr(1000), BudgetPeriod: monthly()})
			g := newGate(t, st, Config{Now: clk.Now})
			p := authenticate(t, g, secret)
			madeAt := clk.Now()
			a, _, err := g.Admit(p, Request{Model: "m", PromptBound: 500, MaxTokens: 100})
			if err != nil {
				t.Fatal(err)
			}
			clk.Advance(40 * time.Second) // December 1, 00:00:10
			b, _, err := g.Admit(p, Request{Model: "m", PromptBound: 200, MaxTokens: 100})
			if err != nil {
				t.Fatalf("300 tokens in December beside 600 reserved in November: %v", err)
			}
			settleAndBill(t, st, p, a, madeAt, Usage{PromptTokens: 500, CompletionTokens: 100})
			settleAndBill(t, st, p, b, clk.Now(), Usage{PromptTokens: 200, CompletionTokens: 100})
			nov, _ := st.TenantPeriodSpend(context.Background(), p.TenantID, time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
			dec, _ := st.TenantPeriodSpend(context.Background(), p.TenantID, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
			if nov.Tokens != 900 || dec.Tokens != 300 {
				t.Fatalf("ledger: %d tokens since November 1 and %d since December 1, want 900 and 300", nov.Tokens, dec.Tokens)
			}
			// 300 of December spent: 600 more fit (they would not, had the
			// November request been counted in December).
			c, _, err := g.Admit(p, Request{Model: "m", PromptBound: 500, MaxTokens: 100})
			if err != nil {
				t.Fatalf("600 more in December: %v", err)
			}
			var qe *QuotaError
			if _, _, err := g.Admit(p, Request{Model: "m", PromptBound: 150, MaxTokens: 50}); !errors.As(err, &qe) {
				t.Fatalf("200 past December's 300 spent and 600 reserved: %v, want a QuotaError", err)
			}
			c.Release()
		})
	}
}

// Two gateways on one PostgreSQL share a monthly budget: in each month,
// together, they never bill past it, and the next month it is whole again.
func TestTwoGatewaysShareMonthlyBudget(t *testing.T) {
	const budget, workers, rounds = 3000, 4, 30
	stA, stB := openShared(t)
	clk := newClock()
	clk.t = time.Date(2026, 11, 30, 22, 0, 0, 0, time.UTC)
	cfg := Config{Now: clk.Now}
	secret, _ := createKey(t, stA, KeyOptions{Tenant: "acme", BudgetTokens: ptr(budget), BudgetPeriod: monthly()})
	var gates [2]*Gate
	stores := [2]*data.Store{stA, stB}
	for i, st := range stores {
		gates[i] = newGate(t, st, cfg)
		runGate(t, gates[i])
	}
	principals := [2]*Principal{authenticate(t, gates[0], secret), authenticate(t, gates[1], secret)}
	month := func(name string, seed uint64) (billed int64) {
		var (
			total              atomic.Int64
			admitted, rejected atomic.Int64
			wg                 sync.WaitGroup
		)
		start := make(chan struct{})
		for w := range 2 * workers {
			i := w % 2
			g, st, p := gates[i], stores[i], principals[i]
			wg.Go(func() {
				<-start
				rng := rand.New(rand.NewPCG(seed, uint64(w)))
				for range rounds {
					r := Request{Model: "m", PromptBound: 30 + rng.Int64N(30), MaxTokens: 1 + rng.Int64N(40)}
					at := clk.Now()
					tk, _, err := g.Admit(p, r)
					if err != nil {
						if qe, ok := errors.AsType[*QuotaError](err); !ok || qe.Period != data.PeriodMonthly {
							t.Errorf("Admit: %v", err)
							return
						}
						rejected.Add(1)
						continue
					}
					admitted.Add(1)
					u := Usage{PromptTokens: r.PromptBound, CompletionTokens: r.MaxTokens}
					tk.Settle(u)
					total.Add(u.PromptTokens + u.CompletionTokens)
					row := data.LedgerRow{Time: at, TenantID: p.TenantID, KeyID: p.KeyID, Model: "m", PromptTokens: u.PromptTokens,
						CompletionTokens: u.CompletionTokens, Status: 200, Outcome: data.OutcomeOK, Stages: data.UnknownStages()}
					if err := st.InsertLedger(context.Background(), []data.LedgerRow{row}); err != nil {
						t.Errorf("ledger: %v", err)
						return
					}
				}
			})
		}
		close(start)
		wg.Wait()
		if admitted.Load() == 0 || rejected.Load() == 0 {
			t.Fatalf("%s: admitted %d, rejected %d: the budget was not contended", name, admitted.Load(), rejected.Load())
		}
		return total.Load()
	}
	nov := month("November", 1)
	clk.Advance(2 * time.Hour) // December 1, 00:00
	dec := month("December", 2)
	ctx := context.Background()
	novSpent, _ := stA.TenantPeriodSpend(ctx, principals[0].TenantID, time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	decSpent, _ := stA.TenantPeriodSpend(ctx, principals[0].TenantID, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	if nov > budget || dec > budget || decSpent.Tokens != dec || novSpent.Tokens != nov+dec {
		t.Fatalf("billed %d in November and %d in December on a monthly budget of %d (ledger: %d since November 1, %d since December 1)",
			nov, dec, budget, novSpent.Tokens, decSpent.Tokens)
	}
	if dec < budget/2 {
		t.Fatalf("December billed only %d of %d: the budget did not reset", dec, budget)
	}
}

// The budget watch reports the use ratio, and an alert once per tenant,
// period and threshold — across two gateways sharing a database, once
// between them.
func TestBudgetWatchAlertsOncePerPeriod(t *testing.T) {
	ctx := context.Background()
	stA, stB := openShared(t)
	clk := newClock()
	clk.t = time.Date(2026, 11, 10, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	var alerts []BudgetAlert
	cfg := Config{Now: clk.Now, OnBudgetAlert: func(a BudgetAlert) { mu.Lock(); alerts = append(alerts, a); mu.Unlock() }}
	secret, _ := createKey(t, stA, KeyOptions{Tenant: "acme", BudgetTokens: ptr(1000), BudgetPeriod: monthly(), BudgetAlertPercent: ptr(80)})
	gA, gB := newGate(t, stA, cfg), newGate(t, stB, cfg)
	p := authenticate(t, gA, secret)
	spend := func(n int64) {
		tk, _, err := gA.Admit(p, Request{Model: "m", PromptBound: n})
		if err != nil {
			t.Fatal(err)
		}
		settleAndBill(t, stA, p, tk, clk.Now(), Usage{PromptTokens: n})
	}
	watch := func() {
		for _, g := range []*Gate{gA, gB} {
			if err := g.WatchBudgets(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	count := func() (n int, last BudgetAlert) {
		mu.Lock()
		defer mu.Unlock()
		if len(alerts) > 0 {
			last = alerts[len(alerts)-1]
		}
		return len(alerts), last
	}
	spend(500)
	watch()
	if n, _ := count(); n != 0 {
		t.Fatalf("%d alerts at 50%%", n)
	}
	spend(350)
	watch()
	watch()
	n, last := count()
	if n != 1 || last.Threshold != 80 || last.Tenant != "acme" || !last.ResetsAt.Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("%d alerts at 85%% (last %+v), want one at 80", n, last)
	}
	gB.tenantsMu.RLock()
	ratio := gB.tenants[p.TenantID].usedRatio
	gB.tenantsMu.RUnlock()
	if ratio != 0.85 {
		t.Fatalf("gateway B measured %v of the budget used, want 0.85", ratio)
	}
	clk.Advance(30 * 24 * time.Hour) // December
	spend(900)
	watch()
	if n, last = count(); n != 2 || !last.PeriodStart.Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("%d alerts after 90%% in December (last %+v), want a second one for December", n, last)
	}
}

// A rotated key keeps its identity and limits under the new secret; the old
// secret works for the grace, then is refused as rotated.
func TestRotateKeyGrace(t *testing.T) {
	ctx := context.Background()
	st, _ := openStore(t)
	clk := newClock()
	old, k := createKey(t, st, KeyOptions{Tenant: "acme", Name: "bob-laptop", Owner: "bob@example.com", RPM: 60})
	g := newGate(t, st, Config{Now: clk.Now})
	authenticate(t, g, old) // cached before the rotation
	secret, rk, err := RotateKey(ctx, st, "acme/bob-laptop", time.Hour, clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	if rk.ID != k.ID || rk.Name != "bob-laptop" || rk.RPM != 60 || secret == old {
		t.Fatalf("rotated key %+v", rk)
	}
	if err := g.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if p := authenticate(t, g, secret); p.KeyID != k.ID || p.RPM != 60 {
		t.Fatalf("new secret's principal %+v", p)
	}
	clk.Advance(59 * time.Minute)
	if p := authenticate(t, g, old); p.KeyID != k.ID {
		t.Fatalf("old secret in its grace: %+v", p)
	}
	clk.Advance(time.Minute)
	_, err = g.Authenticate(ctx, old)
	var exp *ExpiredKeyError
	if !errors.As(err, &exp) || !exp.Rotated || !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("old secret after its grace: %v, want a rotated-key refusal", err)
	}
	authenticate(t, g, secret)
	// With no grace the old secret stops at once.
	newer, _, err := RotateKey(ctx, st, k.ID, 0, clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := g.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Authenticate(ctx, secret); !errors.As(err, &exp) || !exp.Rotated || !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("secret rotated without grace: %v, want a rotated-key refusal (rotated_api_key), not an unknown key", err)
	}
	authenticate(t, g, newer)
}

// TestTenantTotalsSayTheShareUsedNow: the admin view's share of a budget
// used is what the spend beside it says, at once — not the watcher's last
// measure, which lags by up to BudgetWatchInterval (the dashboard showed
// 0.0 % beside 24 tokens spent of a 200-token budget).
func TestTenantTotalsSayTheShareUsedNow(t *testing.T) {
	for _, e := range budgetEngines {
		t.Run(e.name, func(t *testing.T) {
			st := e.open(t)
			clk := newClock()
			clk.t = time.Date(2026, 11, 10, 12, 0, 0, 0, time.UTC)
			secret, k := createKey(t, st, KeyOptions{Tenant: "acme", BudgetTokens: ptr(200), BudgetPeriod: monthly()})
			g := newGate(t, st, Config{Now: clk.Now})
			p := authenticate(t, g, secret)
			tk, _, err := g.Admit(p, Request{Model: "m", PromptBound: 30})
			if err != nil {
				t.Fatal(err)
			}
			settleAndBill(t, st, p, tk, clk.Now(), Usage{PromptTokens: 20, CompletionTokens: 4})
			totals, err := g.TenantTotals(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got := totals[k.Tenant.ID]; got.PeriodSpent.Tokens != 24 || got.UsedRatio != 0.12 {
				t.Fatalf("period spent %d tokens, share used %v; want 24 and 0.12 (24 of 200) before any budget watch",
					got.PeriodSpent.Tokens, got.UsedRatio)
			}
		})
	}
}
