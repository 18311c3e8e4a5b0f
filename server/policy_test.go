package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

const hiBody = `{"model":"tailgate-sim","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`

func TestRequestsPerMinuteLimit(t *testing.T) {
	h := servertest.Start(t, servertest.Options{})
	secret := h.Key(policy.KeyOptions{RPM: 3})
	for i := range 3 {
		resp := h.Post("/v1/chat/completions", secret, hiBody)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i+1, resp.StatusCode)
		}
		if got, want := resp.Header.Get("X-Ratelimit-Remaining-Requests"), strconv.Itoa(2-i); got != want {
			t.Fatalf("request %d: remaining %q, want %q", i+1, got, want)
		}
	}
	resp := h.Post("/v1/chat/completions", secret, hiBody)
	defer resp.Body.Close()
	if resp.StatusCode != 429 {
		t.Fatalf("4th request: %d, want 429", resp.StatusCode)
	}
	if code, _, _ := decodeError(t, resp); code != "rate_limit_exceeded" {
		t.Fatalf("code %q", code)
	}
	ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 60 {
		t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
	}
	if resp.Header.Get("X-Ratelimit-Limit-Requests") != "3" || resp.Header.Get("X-Ratelimit-Remaining-Requests") != "0" {
		t.Fatalf("rate headers on 429: %v", resp.Header)
	}
}

func TestTokensPerMinuteLimit(t *testing.T) {
	h := servertest.Start(t, servertest.Options{})
	// Each request reserves its prompt estimate plus max_tokens=4 against the
	// minute's tokens; 40 tokens admit a few, not many.
	secret := h.Key(policy.KeyOptions{TPM: 40})
	var codes []int
	for range 10 {
		resp := h.Post("/v1/chat/completions", secret, hiBody)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		if resp.StatusCode == 429 {
			if resp.Header.Get("Retry-After") == "" || resp.Header.Get("X-Ratelimit-Limit-Tokens") != "40" {
				t.Fatalf("429 without Retry-After / token headers: %v", resp.Header)
			}
		}
	}
	if codes[0] != 200 || codes[len(codes)-1] != 429 {
		t.Fatalf("codes %v: want the first admitted and the last limited", codes)
	}
}

func TestConcurrencyLimit(t *testing.T) {
	// A first token a second out: the two stay in flight while the third
	// is sent, however slow the race detector makes their authentication.
	h := servertest.Start(t, servertest.Options{Replicas: 1, Sim: sim.Config{TTFT: time.Second, TTFTSigma: -1}})
	secret := h.Key(policy.KeyOptions{MaxConcurrency: 2})
	var wg sync.WaitGroup
	results := make(chan int, 2)
	for range 2 {
		wg.Go(func() {
			resp := h.Post("/v1/chat/completions", secret, hiBody)
			resp.Body.Close()
			results <- resp.StatusCode
		})
	}
	// Wait until both are in flight on the replica.
	deadline := time.Now().Add(5 * time.Second)
	for h.Reg.Replicas()[0].Inflight() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	resp := h.Post("/v1/chat/completions", secret, hiBody)
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third concurrent request: %d (Retry-After %q), want 429", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	wg.Wait()
	close(results)
	for c := range results {
		if c != 200 {
			t.Fatalf("in-limit request got %d", c)
		}
	}
	// Slots are given back: the next request passes.
	resp = h.Post("/v1/chat/completions", secret, hiBody)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("after the others finished: %d", resp.StatusCode)
	}
}

func TestBudgetNeverExceededUnderConcurrency(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 2, Sim: sim.Config{TTFT: 2 * time.Millisecond, TPOT: time.Millisecond}})
	budget := int64(2000)
	secret := h.Key(policy.KeyOptions{Tenant: "small", BudgetTokens: &budget})
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		received int64
		quota    int
	)
	for i := range 120 {
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":"tailgate-sim","max_tokens":20,"stream":%v,"stream_options":null,"messages":[{"role":"user","content":"question %d"}]}`, i%2 == 0, i)
			resp := h.Post("/v1/chat/completions", secret, body)
			defer resp.Body.Close()
			mu.Lock()
			defer mu.Unlock()
			switch resp.StatusCode {
			case 200:
				content := fmt.Sprintf("question %d", i)
				received += int64(sim.ChatPromptTokens(content) + sim.CompletionTokens(20, 0, false, content))
				_, _ = io.ReadAll(resp.Body)
			case 429:
				if code, _, _ := decodeError(t, resp); code != "insufficient_quota" {
					t.Errorf("429 code %q", code)
				}
				quota++
			default:
				t.Errorf("status %d", resp.StatusCode)
			}
		})
	}
	wg.Wait()
	var billed int64
	for _, r := range h.LedgerRows() {
		billed += r.PromptTokens + r.CompletionTokens
	}
	if quota == 0 {
		t.Fatal("no request was refused; the budget did not bind")
	}
	if billed > budget {
		t.Fatalf("billed %d tokens, budget %d", billed, budget)
	}
	if billed != received {
		t.Fatalf("ledger billed %d tokens, clients received %d", billed, received)
	}
	tenant, _ := h.Store.TenantByName(context.Background(), "small")
	spent, reserved := h.Gate.TenantState(tenant.ID)
	if spent.Tokens != billed || reserved.Tokens != 0 {
		t.Fatalf("gate spent %d reserved %d; ledger %d", spent.Tokens, reserved.Tokens, billed)
	}
}

func TestRevokedKeyRejectedWithinASecond(t *testing.T) {
	h := servertest.Start(t, servertest.Options{})
	secret := h.Key(policy.KeyOptions{})
	resp := h.Post("/v1/chat/completions", secret, hiBody)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("before revoke: %d", resp.StatusCode)
	}
	// Revoke through a second handle on the same file, as `tailgate keys revoke` does.
	other, err := data.Open(h.Store.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := policy.RevokeKey(context.Background(), other, secret); err != nil {
		t.Fatal(err)
	}
	revokedAt := time.Now()
	for {
		resp := h.Post("/v1/chat/completions", secret, hiBody)
		resp.Body.Close()
		if resp.StatusCode == http.StatusUnauthorized {
			break
		}
		if time.Since(revokedAt) > time.Second {
			t.Fatalf("revoked key still accepted after %v", time.Since(revokedAt))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// And a key created by the other handle works at once.
	fresh, _, err := policy.CreateKey(context.Background(), other, policy.KeyOptions{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	resp = h.Post("/v1/chat/completions", fresh, hiBody)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("fresh key: %d", resp.StatusCode)
	}
}
