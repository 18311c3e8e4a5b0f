package policy

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

func TestUnpricedBudgets(t *testing.T) {
	prices := map[string]Price{"llama": {InputMicrosPerM: 200_000, OutputMicrosPerM: 600_000}, "free": {}}
	for _, tc := range []struct {
		name      string
		prices    map[string]Price
		keyModels [][]string
		budget    int64
		want      *UnpricedBudget // Tenant and BudgetMicros filled in below
	}{
		{"no money budget", nil, [][]string{nil}, 0, nil},
		{"no key", nil, nil, 5, nil},
		{"every model, no price at all", nil, [][]string{nil}, 5, &UnpricedBudget{Never: true}},
		{"every model, only zero prices", map[string]Price{"free": {}}, [][]string{nil}, 5, &UnpricedBudget{Never: true}},
		{"every model, one priced", prices, [][]string{nil}, 5, nil},
		{"listed models unpriced", prices, [][]string{{"qwen", "free"}}, 5, &UnpricedBudget{Models: []string{"free", "qwen"}, Never: true}},
		{"one listed model free beside a priced one", prices, [][]string{{"llama"}, {"qwen", "llama"}}, 5, &UnpricedBudget{Models: []string{"qwen"}}},
		{"listed and every model", prices, [][]string{{"qwen"}, nil}, 5, &UnpricedBudget{Models: []string{"qwen"}}},
		{"all listed priced", prices, [][]string{{"llama"}}, 5, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _ := openStore(t)
			g := newGate(t, st, Config{Prices: tc.prices})
			for i, models := range tc.keyModels {
				o := KeyOptions{Tenant: "acme", Models: models}
				if i == 0 {
					o.BudgetMicros = &tc.budget
				}
				createKey(t, st, o)
			}
			if len(tc.keyModels) == 0 {
				// A tenant with a budget and no key: made by a revoked one.
				_, k := createKey(t, st, KeyOptions{Tenant: "acme", BudgetMicros: &tc.budget})
				if _, err := RevokeKey(context.Background(), st, k.ID); err != nil {
					t.Fatal(err)
				}
			}
			got, err := g.UnpricedBudgets(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if len(got) != 0 {
					t.Fatalf("got %v, want nothing", got[0])
				}
				return
			}
			want := *tc.want
			want.Tenant, want.BudgetMicros = "acme", tc.budget
			if len(got) != 1 || got[0].Never != want.Never || strings.Join(got[0].Models, ",") != strings.Join(want.Models, ",") ||
				got[0].Tenant != want.Tenant || got[0].BudgetMicros != want.BudgetMicros {
				t.Fatalf("got %+v, want %+v", got, want)
			}
		})
	}
}

// TestRunningGateWarnsOfUnpricedBudgets: a money budget set while the
// gateway runs (by `tailgate keys` on the same database) that no price can
// reach is logged as a warning once, naming the tenant; a request of a
// tenant with a money budget for a model without a price is warned about
// once per tenant and model.
func TestRunningGateWarnsOfUnpricedBudgets(t *testing.T) {
	st, path := openStore(t)
	var logs testkit.Buffer
	g, err := New(context.Background(), Config{PollInterval: 10 * time.Millisecond,
		Prices: map[string]Price{"llama": {InputMicrosPerM: 1, OutputMicrosPerM: 1}}}, st, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	runGate(t, g)

	other := openSecond(t, path)
	createKey(t, other, KeyOptions{Tenant: "acme", BudgetMicros: ptr(1_000_000), Models: []string{"qwen"}})
	within(t, 2*time.Second, "a warning naming the tenant", func() bool {
		return strings.Contains(logs.String(), `tenant \"acme\" has a money budget (1) but none of the models its keys may use has a price (qwen)`)
	})
	createKey(t, other, KeyOptions{Tenant: "unrelated"}) // the key version moves again
	time.Sleep(100 * time.Millisecond)
	if n := strings.Count(logs.String(), `tenant \"acme\"`); n != 1 {
		t.Fatalf("warned %d times about the same budget, want once:\n%s", n, logs.String())
	}

	// Every model allowed, and the one it asks for has no price.
	secret, _ := createKey(t, st, KeyOptions{Tenant: "beta", BudgetMicros: ptr(1_000_000)})
	p := authenticate(t, g, secret)
	for range 3 {
		tk, _, err := g.Admit(p, Request{Model: "mistral", PromptBound: 10, MaxTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		tk.Release()
	}
	if n := strings.Count(logs.String(), `tenant \"beta\" has a money budget (1) that does not limit mistral`); n != 1 {
		t.Fatalf("warned %d times about beta and mistral, want once:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), "does not limit llama") {
		t.Fatal("warned about a priced model")
	}
}

func TestCheckNewKey(t *testing.T) {
	st, _ := openStore(t)
	g := newGate(t, st, Config{Prices: map[string]Price{"llama": {InputMicrosPerM: 1}}})
	var u *UnpricedBudget
	if err := g.CheckNewKey(context.Background(), KeyOptions{Tenant: "acme", BudgetMicros: ptr(5), Models: []string{"qwen"}}); !errors.As(err, &u) || !u.Never {
		t.Fatalf("a new tenant with a budget and an unpriced model: %v, want Never", err)
	}
	if err := g.CheckNewKey(context.Background(), KeyOptions{Tenant: "acme", BudgetMicros: ptr(5), Models: []string{"llama"}}); err != nil {
		t.Fatalf("a priced model: %v", err)
	}
	// The tenant's budget stands; a key that adds an unpriced model beside
	// its priced one is fine (a warning, not a refusal).
	createKey(t, st, KeyOptions{Tenant: "acme", BudgetMicros: ptr(5), Models: []string{"llama"}})
	if err := g.CheckNewKey(context.Background(), KeyOptions{Tenant: "acme", Models: []string{"qwen"}}); err != nil {
		t.Fatalf("an unpriced model beside a priced one: %v", err)
	}
	// Setting the budget to 0 (unlimited) is always fine.
	if err := g.CheckNewKey(context.Background(), KeyOptions{Tenant: "acme", BudgetMicros: ptr(0), Models: []string{"qwen"}}); err != nil {
		t.Fatalf("no money budget: %v", err)
	}
}
