package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// A key made with a name, owner and note through the admin API shows them,
// and — after a request — its last use, requests and spend; a rotation
// gives a new secret that works at once while the old one keeps working for
// the grace asked for; usage groups by day between since and until.
func TestAdminKeyIdentityRotationAndUsage(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1,
		Prices: map[string]policy.Price{"tailgate-sim": {InputMicrosPerM: 1_000_000, OutputMicrosPerM: 1_000_000}}})
	resp := adminPost(t, h, "/admin/v1/keys", `{"tenant":"acme","name":"bob-laptop","owner":"bob@example.com","note":"demo"}`)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var created struct {
		Secret string         `json:"secret"`
		Key    server.KeyView `json:"key"`
	}
	if err := json.Unmarshal(raw, &created); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %s", resp.StatusCode, raw)
	}
	if k := created.Key; k.Name != "bob-laptop" || k.Owner != "bob@example.com" || k.Note != "demo" || k.LastUsedAt != nil {
		t.Fatalf("created key %+v", k)
	}
	dup := adminPost(t, h, "/admin/v1/keys", `{"tenant":"acme","name":"bob-laptop"}`)
	dup.Body.Close()
	if dup.StatusCode != http.StatusConflict {
		t.Fatalf("a second bob-laptop: status %d, want 409", dup.StatusCode)
	}
	if r := h.Post("/v1/chat/completions", created.Secret, hiBody); r.StatusCode != http.StatusOK {
		t.Fatalf("request: status %d", r.StatusCode)
	} else {
		r.Body.Close()
	}
	var keys struct {
		Data []server.KeyView `json:"data"`
	}
	if code := adminGet(t, h, "/admin/v1/keys?tenant=acme", &keys); code != http.StatusOK || len(keys.Data) != 1 {
		t.Fatalf("keys: %d %+v", code, keys)
	}
	if k := keys.Data[0]; k.Requests != 1 || k.SpentTokens == 0 || k.SpentMicros != k.SpentTokens || k.LastUsedAt == nil {
		t.Fatalf("key after one request: %+v", k)
	}

	resp = adminPost(t, h, "/admin/v1/keys/"+created.Key.ID+"/rotate", `{"grace":"1h"}`)
	raw, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	var rotated struct {
		Secret string         `json:"secret"`
		Key    server.KeyView `json:"key"`
	}
	if err := json.Unmarshal(raw, &rotated); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("rotate: %d %s", resp.StatusCode, raw)
	}
	if rotated.Key.ID != created.Key.ID || rotated.Key.Name != "bob-laptop" || rotated.Key.PreviousSecretUntil == nil ||
		rotated.Secret == created.Secret {
		t.Fatalf("rotated key %+v", rotated.Key)
	}
	if d := time.Until(*rotated.Key.PreviousSecretUntil); d < 59*time.Minute || d > time.Hour {
		t.Fatalf("old secret valid until %v, want in an hour", rotated.Key.PreviousSecretUntil)
	}
	for _, secret := range []string{rotated.Secret, created.Secret} {
		deadline := time.Now().Add(5 * time.Second)
		for {
			r := h.Post("/v1/chat/completions", secret, hiBody)
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("a secret of the rotated key: status %d, want 200 (new one, or old one in its grace)", r.StatusCode)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	var usage struct {
		Data []server.UsageView `json:"data"`
	}
	today := time.Now().UTC().Format(time.DateOnly)
	if code := adminGet(t, h, "/admin/v1/usage?by=day&since=1d", &usage); code != http.StatusOK {
		t.Fatalf("usage: %d", code)
	}
	if len(usage.Data) != 1 || usage.Data[0].Period == nil || *usage.Data[0].Period != today || usage.Data[0].Requests != 3 {
		t.Fatalf("usage by day since 1d: %+v, want one day (%s) with 3 requests", usage.Data, today)
	}
	if code := adminGet(t, h, "/admin/v1/usage?by=key&until=2000-01-01", &usage); code != http.StatusOK || len(usage.Data) != 0 {
		t.Fatalf("usage until 2000: %d %+v, want none", code, usage.Data)
	}
	if code := adminGet(t, h, "/admin/v1/usage?by=year", nil); code != http.StatusBadRequest {
		t.Fatalf("usage by year: %d, want 400", code)
	}
}

// A tenant's periodic budget: each answer says when it resets
// (x-ratelimit-reset-budget), and so do the 429 and its Retry-After once it
// is used up.
func TestPeriodicBudgetHeadersAndRefusal(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	tokens, period := int64(400), "daily"
	secret := h.Key(policy.KeyOptions{Tenant: "acme", BudgetTokens: &tokens, BudgetPeriod: &period})
	resp := h.Post("/v1/chat/completions", secret, `{"model":"tailgate-sim","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("first request: %d", resp.StatusCode)
	}
	reset, err := time.ParseDuration(resp.Header.Get("X-Ratelimit-Reset-Budget"))
	untilMidnight := time.Until(time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour))
	if err != nil || reset <= 0 || reset > untilMidnight+time.Second {
		t.Fatalf("x-ratelimit-reset-budget %q, want the time until the next UTC midnight (%v)", resp.Header.Get("X-Ratelimit-Reset-Budget"), untilMidnight)
	}
	var last *http.Response
	for range 10 {
		last = h.Post("/v1/chat/completions", secret, `{"model":"tailgate-sim","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`)
		if last.StatusCode != http.StatusOK {
			break
		}
		last.Body.Close()
	}
	raw, _ := io.ReadAll(last.Body)
	last.Body.Close()
	midnight := time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour).Format(time.RFC3339)
	if last.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(raw), "daily token budget") ||
		!strings.Contains(string(raw), "resets at "+midnight) || last.Header.Get("Retry-After") == "" {
		t.Fatalf("refusal: %d %s (Retry-After %q), want a 429 saying the daily budget resets at %s",
			last.StatusCode, raw, last.Header.Get("Retry-After"), midnight)
	}
}
