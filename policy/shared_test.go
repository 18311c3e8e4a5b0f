package policy

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/data/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop()
	os.Exit(code)
}

// openShared opens two stores on one fresh PostgreSQL database, as two
// gateways do.
func openShared(t testing.TB) (a, b *data.Store) {
	t.Helper()
	url := pgtest.NewDatabase(t)
	return openSecond(t, url), openSecond(t, url)
}

// Two gateways on one PostgreSQL admit requests of one tenant at once, and
// write each settled request's ledger row as the server does: together they
// never bill it past its budget, and once everything settled the database
// holds nothing of the budget any more.
func TestTwoGatewaysNeverExceedSharedBudget(t *testing.T) {
	const budget, workers, rounds = 3000, 6, 40
	stA, stB := openShared(t)
	cfg := Config{Prices: map[string]Price{"m": {InputMicrosPerM: 1_000_000, OutputMicrosPerM: 3_000_000}}}
	secret, _ := createKey(t, stA, KeyOptions{Tenant: "acme", BudgetTokens: ptr(budget), BudgetMicros: ptr(2 * budget)})
	var gates [2]*Gate
	for i, st := range []*data.Store{stA, stB} {
		if _, err := st.SettleOpen(context.Background()); err != nil {
			t.Fatal(err)
		}
		gates[i] = newGate(t, st, cfg)
		runGate(t, gates[i])
	}
	var (
		billedTokens, billedMicros atomic.Int64
		admitted, rejected         [2]atomic.Int64
		wg                         sync.WaitGroup
	)
	// Every worker authenticates first and all start together: a worker of
	// one gateway that ran ahead while the other's were still being set up
	// could spend the whole budget alone (seen once in a full run).
	principals := [2]*Principal{authenticate(t, gates[0], secret), authenticate(t, gates[1], secret)}
	start := make(chan struct{})
	round := newBarrier(2 * workers)
	for w := range 2 * workers {
		i := w % 2
		g, st, p := gates[i], []*data.Store{stA, stB}[i], principals[i]
		wg.Go(func() {
			<-start
			rng := rand.New(rand.NewPCG(uint64(w), 2))
			for range rounds {
				// Every round starts together on both gateways: a worker that
				// ran ahead could spend the whole budget before the other
				// gateway's first request (seen twice in full runs).
				round.wait()
				r := Request{Model: "m", PromptEstimate: 20, PromptBound: 30 + rng.Int64N(30), MaxTokens: 1 + rng.Int64N(40)}
				tk, _, err := g.Admit(p, r)
				if err != nil {
					var qe *QuotaError
					if !errors.As(err, &qe) {
						t.Errorf("Admit: %v", err)
						continue
					}
					rejected[i].Add(1)
					continue
				}
				admitted[i].Add(1)
				u := Usage{PromptTokens: rng.Int64N(r.PromptBound + 1), CompletionTokens: rng.Int64N(r.MaxTokens + 1)}
				c := tk.Settle(u)
				billedTokens.Add(u.PromptTokens + u.CompletionTokens)
				billedMicros.Add(c)
				row := data.LedgerRow{TenantID: p.TenantID, KeyID: p.KeyID, Model: "m", PromptTokens: u.PromptTokens,
					CompletionTokens: u.CompletionTokens, CostMicros: c, Status: 200, Outcome: data.OutcomeOK, Stages: data.UnknownStages()}
				if err := st.InsertLedger(context.Background(), []data.LedgerRow{row}); err != nil {
					t.Errorf("ledger: %v", err)
					continue
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if billedTokens.Load() > budget || billedMicros.Load() > 2*budget {
		t.Fatalf("two gateways billed %d tokens and %d micros on budgets of %d and %d",
			billedTokens.Load(), billedMicros.Load(), budget, 2*budget)
	}
	for i := range gates {
		if admitted[i].Load() == 0 || rejected[i].Load() == 0 {
			t.Fatalf("gateway %d admitted %d, rejected %d: the budget was not contended", i, admitted[i].Load(), rejected[i].Load())
		}
	}
	spend, err := stA.TenantSpend(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got data.Spend
	for _, sp := range spend {
		got.Tokens += sp.Tokens
		got.Micros += sp.Micros
	}
	if got.Tokens != billedTokens.Load() || got.Micros != billedMicros.Load() {
		t.Fatalf("ledger spend %+v, billed %d tokens / %d micros", got, billedTokens.Load(), billedMicros.Load())
	}
	within(t, 5*time.Second, "holds released once every request settled", func() bool {
		held, err := stA.BudgetHeld(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range held {
			if h != (data.Spend{}) {
				return false
			}
		}
		return true
	})
}

// A key created through one gateway's database is accepted by another
// gateway on the same PostgreSQL, and a revocation made through one is
// honoured by the other within 1 s, though it had the key cached.
func TestKeysHonouredAcrossGateways(t *testing.T) {
	ctx := context.Background()
	stA, stB := openShared(t)
	gA, gB := newGate(t, stA, Config{}), newGate(t, stB, Config{})
	runGate(t, gA)
	runGate(t, gB)
	secret, k := createKey(t, stA, KeyOptions{Tenant: "acme"})
	within(t, time.Second, "gateway B accepts a key created on A", func() bool {
		_, err := gB.Authenticate(ctx, secret)
		return err == nil
	})
	authenticate(t, gA, secret) // cached on both now
	if _, err := RevokeKey(ctx, stB, k.ID); err != nil {
		t.Fatal(err)
	}
	within(t, time.Second, "gateway A rejects a key revoked on B", func() bool {
		_, err := gA.Authenticate(ctx, secret)
		return errors.Is(err, ErrInvalidKey)
	})
}

// Two gateways on one PostgreSQL each enforce half of a key's rpm and
// concurrency (limit/N, N the gateways with a live lease): together they
// admit the key's limit, not twice it.
func TestKeyLimitsNotMultipliedByGateways(t *testing.T) {
	stA, stB := openShared(t)
	gates := []*Gate{newGate(t, stA, Config{}), newGate(t, stB, Config{})}
	for _, g := range gates {
		runGate(t, g)
	}
	within(t, 5*time.Second, "both gateways count two live leases", func() bool {
		return gates[0].gateways.Load() == 2 && gates[1].gateways.Load() == 2
	})
	const rpm, conc = 10, 4
	rpmKey, _ := createKey(t, stA, KeyOptions{Tenant: "acme", RPM: rpm})
	concKey, _ := createKey(t, stA, KeyOptions{Tenant: "acme", MaxConcurrency: conc})
	for _, c := range []struct {
		name   string
		secret string
		limit  int
		settle bool
	}{{"rpm", rpmKey, rpm, true}, {"concurrency", concKey, conc, false}} {
		admitted := 0
		for _, g := range gates {
			p := authenticate(t, g, c.secret)
			for range 2 * c.limit {
				tk, _, err := g.Admit(p, Request{Model: "m", PromptEstimate: 1, PromptBound: 1, MaxTokens: 1})
				if err != nil {
					continue
				}
				admitted++
				if c.settle {
					tk.Release()
				} else {
					defer tk.Release()
				}
			}
		}
		if admitted > c.limit || admitted < c.limit-1 {
			t.Errorf("%s %d: two gateways admitted %d requests at once", c.name, c.limit, admitted)
		}
	}
}

// TestSpareBudgetSavesRoundTrips: what settled requests reserved beyond
// their cost stays held as the gateway's spare, so a tenant's next requests
// reserve from it instead of one database round trip each; the spare
// stays under its share of the budget, and an idle spare goes back.
func TestSpareBudgetSavesRoundTrips(t *testing.T) {
	const budget, requests = 100_000, 200
	st, _ := openShared(t)
	secret, _ := createKey(t, st, KeyOptions{Tenant: "acme", BudgetTokens: ptr(budget)})
	g := newGate(t, st, Config{})
	runGate(t, g)
	p := authenticate(t, g, secret)
	for range requests {
		tk, _, err := g.Admit(p, Request{Model: "m", PromptEstimate: 20, PromptBound: 60, MaxTokens: 40})
		if err != nil {
			t.Fatal(err)
		}
		tk.Settle(Usage{PromptTokens: 20, CompletionTokens: 10})
	}
	n := g.shared.booked.Load()
	if n > requests/10 {
		t.Errorf("%d of %d reservations went to the database; want most from the spare", n, requests)
	}
	t.Logf("%d of %d reservations went to the database", n, requests)
	held, err := st.BudgetHeld(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// No ledger rows were written: what is held is every settled cost plus
	// the spare, which stays under its cap.
	var h data.Spend
	for _, s := range held {
		h.Tokens += s.Tokens
	}
	if spare := h.Tokens - requests*30; spare < 0 || spare > budget/spareShare {
		t.Errorf("held %d tokens = %d settled + a spare of %d; want a spare within 0..%d", h.Tokens, requests*30, spare, budget/spareShare)
	}
	within(t, 5*time.Second, "an idle spare released", func() bool {
		held, err := st.BudgetHeld(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var h data.Spend
		for _, s := range held {
			h.Tokens += s.Tokens
		}
		return h.Tokens == requests*30
	})
}

// barrier lets n goroutines wait for each other, round after round.
type barrier struct {
	mu      sync.Mutex
	n, in   int
	release chan struct{}
}

func newBarrier(n int) *barrier { return &barrier{n: n, release: make(chan struct{})} }

// wait returns once all n goroutines called it in this round.
func (b *barrier) wait() {
	b.mu.Lock()
	b.in++
	if b.in == b.n {
		close(b.release)
		b.in, b.release = 0, make(chan struct{})
		b.mu.Unlock()
		return
	}
	ch := b.release
	b.mu.Unlock()
	<-ch
}
