package sidecar

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// The engine answers only requests with its API key: the sidecar adds the
// key to everything it sends the engine, in place of the client's cluster
// token, and a client on the box that calls the engine directly without it
// is refused.
func TestEngineKeyReachesTheEngine(t *testing.T) {
	const key = "engine-key"
	eng := startEngine(t, sim.Config{Model: "m", APIKey: key})

	// Every path the sidecar asks, with the Authorization it sent.
	var mu sync.Mutex
	sent := map[string]string{}
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sent[r.URL.Path] = r.Header.Get("Authorization")
		mu.Unlock()
		r.URL.Scheme, r.URL.Host, r.RequestURI = "http", eng.srv.Listener.Addr().String(), ""
		resp, err := http.DefaultTransport.RoundTrip(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		relayAsIs(w, resp)
	}))
	t.Cleanup(front.Close)

	s, sc := startSidecar(t, front.URL, func(c *Config) {
		c.EngineKey = func() string { return key }
		c.HealthInterval = 10 * time.Millisecond
		c.ScrapeInterval = 10 * time.Millisecond
	})
	runSidecar(t, s)

	ctx := context.Background()
	chat := `{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":2}`
	if status, _, body := send(t, ctx, http.MethodPost, sc.URL+"/v1/chat/completions", chat); status != http.StatusOK {
		t.Errorf("chat through the sidecar: %d %s", status, body)
	}
	if status, _, body := send(t, ctx, http.MethodPost, sc.URL+"/v1/chat/completions",
		`{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":2,"stream":true}`); status != http.StatusOK {
		t.Errorf("streamed chat through the sidecar: %d %s", status, body)
	}
	if status, _, body := send(t, ctx, http.MethodGet, sc.URL+"/v1/models", ""); status != http.StatusOK {
		t.Errorf("models through the sidecar: %d %s", status, body)
	}
	testkit.WaitFor(t, "a health probe and a scrape", func() bool {
		mu.Lock()
		defer mu.Unlock()
		_, health := sent["/health"]
		_, metrics := sent["/metrics"]
		return health && metrics
	})
	mu.Lock()
	for path, auth := range sent {
		if auth != "Bearer "+key {
			t.Errorf("sidecar sent %s with Authorization %q, want the engine key", path, auth)
		}
	}
	mu.Unlock()

	// Straight to the engine, without the key or with the cluster token.
	for _, auth := range []string{"", "Bearer " + testToken} {
		req, _ := http.NewRequest(http.MethodPost, eng.srv.URL+"/v1/chat/completions", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("direct call to the engine with Authorization %q: %d, want 401", auth, resp.StatusCode)
		}
	}
}
