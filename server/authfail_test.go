package server_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// TestAuthFailuresAreCountedByReasonAndLoggedWithoutTheSecret: every 401
// and 403 for a key shows in tailgate_auth_failures_total under its reason
// (missing, invalid, revoked, expired, model_not_allowed); the log names
// the key by its display prefix and never holds a secret.
func TestAuthFailuresAreCountedByReasonAndLoggedWithoutTheSecret(t *testing.T) {
	var logs testkit.Buffer
	h := servertest.Start(t, servertest.Options{Replicas: 1, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	count := func(reason string) float64 {
		return counterSum(t, h, "tailgate_auth_failures_total", "reason", reason)
	}
	mfs, err := h.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == "tailgate_auth_failures_total" {
				exported[m.GetLabel()[0].GetValue()] = true
			}
		}
	}
	for _, r := range []string{"missing", "invalid", "revoked", "expired", "model_not_allowed"} {
		if !exported[r] {
			t.Errorf("tailgate_auth_failures_total{reason=%q} is not exported before any failure", r)
		}
	}
	send := func(secret string) int {
		resp := h.Post("/v1/chat/completions", secret, hiBody)
		resp.Body.Close()
		return resp.StatusCode
	}

	unknown := policy.SecretPrefix + strings.Repeat("A", 43) // well formed, no such key
	revoked := h.Key(policy.KeyOptions{Tenant: "gone"})
	expiring := h.Key(policy.KeyOptions{Tenant: "late", ExpiresAt: time.Now().Add(300 * time.Millisecond)})
	narrow := h.Key(policy.KeyOptions{Tenant: "narrow", Models: []string{"another-model"}})
	if code := send(revoked); code != http.StatusOK {
		t.Fatalf("a good key: %d", code)
	}
	req, _ := http.NewRequest(http.MethodDelete, h.Admin.URL+"/admin/v1/keys/"+revoked[:11], nil)
	req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("revoke: %v %v", resp, err)
	}
	waitUntil(t, 3*time.Second, "the revoked key is refused", func() bool { return send(revoked) == http.StatusUnauthorized })
	waitUntil(t, 3*time.Second, "the key expires", func() bool { return send(expiring) == http.StatusUnauthorized })

	for _, tc := range []struct {
		secret, reason string
		want           int
	}{
		{"", "missing", http.StatusUnauthorized},
		{"sk-not-a-key", "invalid", http.StatusUnauthorized},
		{unknown, "invalid", http.StatusUnauthorized},
		{revoked, "revoked", http.StatusUnauthorized},
		{expiring, "expired", http.StatusUnauthorized},
		{narrow, "model_not_allowed", http.StatusForbidden},
	} {
		before := count(tc.reason)
		if code := send(tc.secret); code != tc.want {
			t.Errorf("%s: %d, want %d", tc.reason, code, tc.want)
		}
		if got := count(tc.reason) - before; got != 1 {
			t.Errorf("%s: tailgate_auth_failures_total{reason=%q} rose by %v, want 1", tc.reason, tc.reason, got)
		}
	}

	out := logs.String()
	for _, secret := range []string{revoked, expiring, narrow, unknown, "sk-not-a-key"} {
		if strings.Contains(out, secret) {
			t.Errorf("the log holds a secret:\n%s", out)
		}
	}
	if !strings.Contains(out, "request refused for its API key") || !strings.Contains(out, "key_prefix="+revoked[:11]) {
		t.Errorf("no refusal line naming the key's display prefix %s:\n%s", revoked[:11], out)
	}
}

// waitUntil polls cond every 20 ms until it holds or within passes.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
	}
}
