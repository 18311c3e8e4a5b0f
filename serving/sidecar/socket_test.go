package sidecar

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// socketEngine is a simulated engine that listens on a Unix socket only, as
// the launcher starts one, and counts the requests it got by method and path.
type socketEngine struct {
	path string
	srv  *http.Server
	done chan struct{}

	mu  sync.Mutex
	got map[string]int
}

func startSocketEngine(t *testing.T, path string) *socketEngine {
	t.Helper()
	e, err := sim.New(sim.Config{Model: "m", APIKey: "engine-key"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := sim.ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	se := &socketEngine{path: path, done: make(chan struct{}), got: map[string]int{}}
	se.srv = e.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		se.mu.Lock()
		se.got[r.Method+" "+r.URL.Path]++
		se.mu.Unlock()
		e.Handler().ServeHTTP(w, r)
	}))
	go func() { defer close(se.done); _ = se.srv.Serve(ln) }()
	t.Cleanup(se.stop)
	return se
}

func (se *socketEngine) stop() {
	_ = se.srv.Close()
	<-se.done
}

func (se *socketEngine) count(req string) int {
	se.mu.Lock()
	defer se.mu.Unlock()
	return se.got[req]
}

// TestEngineOnAUnixSocket: with EngineSocket set, requests, health probes
// and metrics scrapes all reach the engine on its socket (it listens on
// nothing else, and EngineURL's host could not be dialed), with the
// engine's key; an engine gone from its socket is unavailable, and one
// started on a new socket is followed at the next dial.
func TestEngineOnAUnixSocket(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first := startSocketEngine(t, filepath.Join(dir, "engine.sock"))
	var sock atomic.Value
	sock.Store(first.path)
	s, sc := startSidecar(t, "http://engine.invalid", func(c *Config) {
		c.EngineSocket = func() string { return sock.Load().(string) }
		c.EngineKey = func() string { return "engine-key" }
		c.ScrapeInterval = 5 * time.Millisecond
		c.HealthInterval = 10 * time.Millisecond
	})
	runSidecar(t, s)

	chat := func(stream bool) (int, string) {
		body := `{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":3,"stream":` + map[bool]string{false: "false", true: "true"}[stream] + `}`
		status, _, b := send(t, context.Background(), http.MethodPost, sc.URL+"/v1/chat/completions", body)
		return status, string(b)
	}
	status, body := chat(false)
	var answer struct {
		Choices []struct{ Message struct{ Content string } }
	}
	if err := json.Unmarshal([]byte(body), &answer); status != http.StatusOK || err != nil || len(answer.Choices) != 1 || answer.Choices[0].Message.Content == "" {
		t.Fatalf("chat over the socket: %d %s", status, body)
	}
	if status, body := chat(true); status != http.StatusOK || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Errorf("streamed chat over the socket: %d %s", status, body)
	}
	testkit.WaitFor(t, "health probes and metrics scrapes on the socket", func() bool {
		return first.count("GET /health") > 0 && first.count("GET /metrics") > 0 && s.scraped.Load() != nil
	})
	if st, reason := s.State(); st != "ready" {
		t.Errorf("state %s (%s), want ready: the health probes reach the engine", st, reason)
	}

	// The engine leaves its socket (it stopped; the launcher will start
	// another at the same or a new path).
	first.stop()
	status, body = chat(false)
	if status != http.StatusServiceUnavailable || !strings.Contains(body, `"code":"engine_unavailable"`) {
		t.Errorf("engine gone from its socket: %d %s, want 503 engine_unavailable", status, body)
	}
	second := startSocketEngine(t, filepath.Join(dir, "engine-2.sock"))
	sock.Store(second.path)
	if status, body := chat(false); status != http.StatusOK {
		t.Errorf("engine on its new socket: %d %s", status, body)
	}
	if second.count("POST /v1/chat/completions") != 1 {
		t.Errorf("the new engine got %d chats, want 1", second.count("POST /v1/chat/completions"))
	}
}
