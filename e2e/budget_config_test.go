package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tailgate/data"
	"tailgate/policy"
)

// TestGatewayRefusesAMoneyBudgetNoPriceReaches: a tenant's money budget
// counts only priced models. When no model the tenant may use has a price,
// the budget would silently never be enforced, so the gateway refuses to
// start and names the tenant (and the models its keys list); when some
// model its keys name is free beside priced ones, it starts and warns,
// naming the model.
func TestGatewayRefusesAMoneyBudgetNoPriceReaches(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the tailgate binary")
	}
	// A data directory as a gateway leaves it, with one tenant and its key.
	deployment := func(t *testing.T, models ...string) string {
		dir := t.TempDir()
		st, err := data.Open(filepath.Join(dir, "tailgate.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		budget := int64(10_000_000) // 10 currency units
		if _, _, err := policy.CreateKey(context.Background(), st, policy.KeyOptions{Tenant: "acme", BudgetMicros: &budget, Models: models}); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	gateway := func(dir string, extra ...string) []string {
		return append([]string{"gateway", "--data", dir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, extra...)
	}
	for _, tc := range []struct {
		name   string
		models []string
		flags  []string
		want   []string
	}{
		{"no price at all", nil, nil,
			[]string{`tenant "acme" has a money budget (10) but no model has a price, so it is never reached`, "--price MODEL=IN,OUT"}},
		{"only other models priced", []string{"llama", "qwen"}, []string{"--price", "mistral=1,2"},
			[]string{`tenant "acme"`, "none of the models its keys may use has a price (llama, qwen)"}},
		{"a price of zero", []string{"llama"}, []string{"--price", "llama=0,0"},
			[]string{`tenant "acme"`, "(llama)", "never reached"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stderr := runToExit(t, 30*time.Second, gateway(deployment(t, tc.models...), tc.flags...)...)
			if code != 1 {
				t.Errorf("exit status %d, want 1", code)
			}
			line := errorLine(t, stderr)
			for _, w := range tc.want {
				if !strings.Contains(line, w) {
					t.Errorf("error line lacks %q", w)
				}
			}
			if t.Failed() {
				t.Logf("stderr:\n%s", stderr)
			}
		})
	}

	t.Run("one listed model free", func(t *testing.T) {
		p := startProc(t, "gateway", true, gateway(deployment(t, "llama", "qwen"), "--price", "llama=0.2,0.6")...)
		bound := time.AfterFunc(30*time.Second, func() { _ = p.Stop(0) })
		defer bound.Stop()
		served := false
		p.scanUntil(func(line string) bool {
			served = strings.HasPrefix(line, "tailgate gateway: API")
			return served
		})
		if !served {
			t.Fatalf("the gateway did not start")
		}
		// stderr is another pipe than stdout: its lines may arrive a moment
		// after the banner.
		var warn string
		for deadline := time.Now().Add(10 * time.Second); warn == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			for _, l := range strings.Split(p.stderr.String(), "\n") {
				if strings.Contains(l, "level=WARN") && strings.Contains(l, "money budget") {
					warn = l
				}
			}
		}
		if !strings.Contains(warn, `tenant \"acme\"`) || !strings.Contains(warn, "does not limit qwen") {
			t.Errorf("no warning naming the tenant and the free model; stderr:\n%s", p.stderr.String())
		}
	})
}
