package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
)

// A budget alert is POSTed as signed JSON; a receiver that fails twice gets
// it on the third try, and one that always fails is tried a bounded number
// of times.
func TestBudgetWebhookSignsAndRetries(t *testing.T) {
	secret := []byte("cluster-token-for-the-test")
	var (
		mu     sync.Mutex
		tries  = map[string]int{}
		bodies = map[string][]byte{}
		sigOK  = true
	)
	got := make(chan string, 8)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var a server.BudgetAlertJSON
		_ = json.Unmarshal(body, &a)
		mu.Lock()
		tries[a.Tenant]++
		n := tries[a.Tenant]
		bodies[a.Tenant] = body
		if r.Header.Get("X-Tailgate-Signature") != server.SignWebhook(secret, r.Header.Get("X-Tailgate-Timestamp"), body) {
			sigOK = false
		}
		mu.Unlock()
		if a.Tenant == "flaky" && n <= 2 || a.Tenant == "down" {
			w.WriteHeader(http.StatusServiceUnavailable)
			if a.Tenant == "down" && n == 3 {
				got <- "down"
			}
			return
		}
		w.WriteHeader(http.StatusNoContent)
		got <- a.Tenant
	}))
	defer rcv.Close()
	wh, err := server.NewBudgetWebhook(server.BudgetWebhookConfig{URL: rcv.URL, Secret: secret, Attempts: 3, Backoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- wh.Run(ctx) }()
	defer func() { cancel(); <-done }()
	resets := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	wh.Notify(policy.BudgetAlert{Tenant: "flaky", Threshold: 80, UsedPercent: 85, Budget: "tokens", Used: 850, Limit: 1000,
		Period: "monthly", PeriodStart: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), ResetsAt: resets, At: time.Now()})
	wh.Notify(policy.BudgetAlert{Tenant: "down", Threshold: 100})
	for range 2 {
		select {
		case <-got:
		case <-time.After(10 * time.Second):
			t.Fatal("the alerts were not delivered (or tried) within 10s")
		}
	}
	// "down" reported its third try, the last.
	mu.Lock()
	defer mu.Unlock()
	if tries["flaky"] != 3 || tries["down"] != 3 || !sigOK {
		t.Fatalf("tries %v, signatures valid %v; want 3 each (two failures then success; bounded at 3), valid", tries, sigOK)
	}
	var a server.BudgetAlertJSON
	if err := json.Unmarshal(bodies["flaky"], &a); err != nil || a.Type != "budget.threshold" || a.ThresholdPercent != 80 ||
		a.Period != "monthly" || a.ResetsAt == nil || !a.ResetsAt.Equal(resets) || a.Used != 850 || a.Limit != 1000 {
		t.Fatalf("alert body %s", bodies["flaky"])
	}
	if _, err := server.NewBudgetWebhook(server.BudgetWebhookConfig{URL: "ftp://example.com", Secret: secret}); err == nil {
		t.Fatal("an ftp:// webhook URL was accepted")
	}
}
