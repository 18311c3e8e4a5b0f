package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// TestQuotaErrorSaysRequestedAndLeft: a request whose worst case (prompt
// bound plus max_tokens) is larger than what its tenant's budget has left is
// refused before anything was spent; the 429 insufficient_quota says so,
// with what it asked for and what is left, rather than "used up".
func TestQuotaErrorSaysRequestedAndLeft(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1,
		Prices: map[string]policy.Price{"tailgate-sim": {InputMicrosPerM: 1_000_000, OutputMicrosPerM: 1_000_000}}})
	tokens, micros := int64(500), int64(400) // 400 micro-units: 400 tokens at this price
	body := `{"model":"tailgate-sim","max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}`
	// The worst case: the prompt bound (about the body's size in bytes)
	// plus max_tokens.
	requested := regexp.MustCompile(`may use up to (\d+) tokens|may use up to 0\.00(\d+) \(`)
	for _, tc := range []struct {
		name string
		opts policy.KeyOptions
		want []string
	}{
		{"token budget", policy.KeyOptions{Tenant: "tokens", BudgetTokens: &tokens}, []string{
			"more than the 500 tokens left", "token budget of 500",
			"0 spent, 0 reserved", "lower max_tokens"}},
		{"cost budget", policy.KeyOptions{Tenant: "money", BudgetMicros: &micros}, []string{
			"more than the 0.0004 left", "cost budget of 0.0004", "0 spent, 0 reserved"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			secret := h.Key(tc.opts)
			resp := h.Post("/v1/chat/completions", secret, body)
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			var e struct {
				Error struct {
					Message string `json:"message"`
					Code    string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(raw, &e); err != nil || resp.StatusCode != http.StatusTooManyRequests || e.Error.Code != "insufficient_quota" {
				t.Fatalf("status %d body %s, want 429 insufficient_quota", resp.StatusCode, raw)
			}
			for _, w := range tc.want {
				if !strings.Contains(e.Error.Message, w) {
					t.Errorf("message lacks %q:\n%s", w, e.Error.Message)
				}
			}
			if m := requested.FindStringSubmatch(e.Error.Message); m == nil {
				t.Errorf("message does not say what the request needs:\n%s", e.Error.Message)
			} else if n, _ := strconv.Atoi(m[1] + m[2]); n < 1000+len(body) {
				t.Errorf("message says the request needs %d, less than its max_tokens and body:\n%s", n, e.Error.Message)
			}
			if strings.Contains(e.Error.Message, "used up") {
				t.Errorf("message says the budget is used up; nothing was spent:\n%s", e.Error.Message)
			}
			// A request that fits passes: the budget was not used up.
			ok := h.Post("/v1/chat/completions", secret, `{"model":"tailgate-sim","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
			ok.Body.Close()
			if ok.StatusCode != http.StatusOK {
				t.Fatalf("a small request after the refusal: status %d, want 200", ok.StatusCode)
			}
		})
	}
}
