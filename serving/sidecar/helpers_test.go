package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

const testToken = "cluster-secret"

// engine is a simulated engine on loopback behind a tap that records what
// the engine wrote, so tests can compare the sidecar's answer byte for byte.
type engine struct {
	*sim.Engine
	srv *httptest.Server

	gate     chan struct{} // requests with "X-Test-Gate" write once, then wait for it
	openGate sync.Once

	mu      sync.Mutex
	answers []tapped
}

type tapped struct {
	path   string
	header http.Header // of the request
	body   []byte
}

func startEngine(t testing.TB, cfg sim.Config) *engine {
	t.Helper()
	e, err := sim.New(cfg, nil)
	if err != nil {
		t.Fatalf("sim.New: %v", err)
	}
	eng := &engine{Engine: e, gate: make(chan struct{})}
	eng.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tw := &tapWriter{ResponseWriter: w, eng: eng, idx: -1, gated: r.Header.Get("X-Test-Gate") != ""}
		if r.URL.Path != "/metrics" {
			eng.mu.Lock()
			eng.answers = append(eng.answers, tapped{path: r.URL.Path, header: r.Header.Clone()})
			tw.idx = len(eng.answers) - 1
			eng.mu.Unlock()
		}
		e.Handler().ServeHTTP(tw, r)
	}))
	t.Cleanup(eng.srv.Close)
	t.Cleanup(eng.release) // before Close, which waits for gated answers
	return eng
}

// release lets gated answers go on.
func (e *engine) release() { e.openGate.Do(func() { close(e.gate) }) }

// lastAnswer returns what the engine wrote for its latest request.
func (e *engine) lastAnswer(t testing.TB) tapped {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.answers) == 0 {
		t.Fatal("the engine got no request")
	}
	a := e.answers[len(e.answers)-1]
	a.body = bytes.Clone(a.body)
	return a
}

func (e *engine) requests() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.answers)
}

type tapWriter struct {
	http.ResponseWriter
	eng    *engine
	idx    int // in eng.answers; -1: not recorded
	gated  bool
	writes int
}

func (w *tapWriter) Write(b []byte) (int, error) {
	if w.gated && w.writes > 0 {
		<-w.eng.gate
	}
	w.writes++
	if w.idx >= 0 {
		w.eng.mu.Lock()
		w.eng.answers[w.idx].body = append(w.eng.answers[w.idx].body, b...)
		w.eng.mu.Unlock()
	}
	return w.ResponseWriter.Write(b)
}

func (w *tapWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// startSidecar runs a ready sidecar in front of engineURL.
func startSidecar(t testing.TB, engineURL string, tweak func(*Config)) (*Sidecar, *httptest.Server) {
	t.Helper()
	cfg := Config{EngineURL: func() string { return engineURL }, ClusterToken: testToken}
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	s.SetState(serving.StateReady, "")
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return s, srv
}

// send makes a request with the cluster token and returns the answer whole.
func send(t testing.TB, ctx context.Context, method, url, body string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	resp := open(t, ctx, method, url, body, append([]string{"Authorization", "Bearer " + testToken}, hdr...)...)
	if resp == nil {
		return 0, nil, nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("read answer: %v", err)
	}
	return resp.StatusCode, resp.Header, b
}

// open sends a request with exactly the given headers (name, value pairs)
// and returns the response once its headers are in.
func open(t testing.TB, ctx context.Context, method, url, body string, hdr ...string) *http.Response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", method, url, err)
		return nil
	}
	return resp
}

// readEvent reads one SSE event (lines up to and including the blank line)
// from a live stream.
func readEvent(t testing.TB, r *bufio.Reader) string {
	t.Helper()
	var ev strings.Builder
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read event: %v (so far %q)", err, ev.String())
		}
		ev.WriteString(line)
		if line == "\n" {
			return ev.String()
		}
	}
}

// splitEvents splits an SSE body into its events, blank line included.
func splitEvents(body []byte) []string {
	var out []string
	for len(body) > 0 {
		i := bytes.Index(body, []byte("\n\n"))
		if i < 0 {
			return append(out, string(body))
		}
		out = append(out, string(body[:i+2]))
		body = body[i+2:]
	}
	return out
}

// timing parses a timing comment event; ok is false if ev is none.
func timing(t testing.TB, ev string) (vals map[string]float64, ok bool) {
	t.Helper()
	rest, ok := strings.CutPrefix(ev, serving.TimingComment)
	if !ok {
		return nil, false
	}
	rest, found := strings.CutSuffix(rest, "\n\n")
	if !found {
		t.Fatalf("timing comment %q does not end its event", ev)
	}
	vals = map[string]float64{}
	for _, kv := range strings.Fields(rest) {
		k, v, _ := strings.Cut(kv, "=")
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatalf("timing comment %q: %s: %v", ev, k, err)
		}
		vals[k] = f
	}
	return vals, true
}

// logBuffer collects slog output for assertions.
type logBuffer struct{ testkit.Buffer }

func (b *logBuffer) count(msg string) int {
	return strings.Count(b.String(), "msg=\""+msg+"\"")
}

func newLogger(b *logBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
