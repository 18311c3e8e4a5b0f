package load

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// openAIStub is a minimal OpenAI-compatible server that records the bodies
// it was sent.
type openAIStub struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies []string
}

func newOpenAIStub(t *testing.T, delay time.Duration) *openAIStub {
	s := &openAIStub{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.bodies = append(s.bodies, string(body))
		s.mu.Unlock()
		time.Sleep(delay)
		if bytes.Contains(body, []byte(`"stream":true`)) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":1}}`)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *openAIStub) sorted() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.bodies)
	slices.Sort(out)
	return out
}

// TestMainCompareSendsBothTargetsTheSameRequests: a comparison runs the same
// seeded workload against A and B — the same request bodies, the same
// number — and prints them side by side; the JSON file holds both.
func TestMainCompareSendsBothTargetsTheSameRequests(t *testing.T) {
	a, b := newOpenAIStub(t, 2*time.Millisecond), newOpenAIStub(t, 8*time.Millisecond)
	jsonPath := filepath.Join(t.TempDir(), "c.json")
	var stdout, stderr bytes.Buffer
	err := Main(context.Background(), Options{
		A: Side{Target: a.srv.URL + "/v1", Key: "k", Model: "m"}, B: Side{Target: b.srv.URL + "/v1"}, Compare: true,
		Phases: "steady:500ms", Rate: 40, Seed: 1, JSONFile: jsonPath, Stdout: &stdout, Stderr: &stderr,
	})
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr.String())
	}
	ba, bb := a.sorted(), b.sorted()
	if len(ba) == 0 || !slices.Equal(ba, bb) {
		t.Fatalf("A got %d requests, B %d; same bodies: %v", len(ba), len(bb), slices.Equal(ba, bb))
	}
	out := stdout.String()
	for _, want := range []string{"== compare: A = A: " + a.srv.URL, "matched: seed 1", "B/A", "ttft p99"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	var c Comparison
	raw, _ := os.ReadFile(jsonPath)
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	if !c.Matched || len(c.A.Requests) != len(ba) || len(c.B.Requests) != len(bb) {
		t.Errorf("comparison JSON: matched %v, %d and %d requests", c.Matched, len(c.A.Requests), len(c.B.Requests))
	}
	if !strings.Contains(stderr.String(), "bench: wrote "+jsonPath) {
		t.Errorf("stderr does not say the JSON was written:\n%s", stderr.String())
	}
}

// TestMainHooksActOnAnExternalTarget: against a target the bench did not
// start, a kill phase runs OnKill and the replica it prints is the one the
// failover figures are about.
func TestMainHooksActOnAnExternalTarget(t *testing.T) {
	a := newOpenAIStub(t, time.Millisecond)
	marker := filepath.Join(t.TempDir(), "killed")
	var stdout, stderr bytes.Buffer
	err := Main(context.Background(), Options{A: Side{Target: a.srv.URL + "/v1", Model: "m"},
		Phases: "steady:300ms,kill:1,steady:300ms", Rate: 20,
		OnKill: "echo $TAILGATE_BENCH_COUNT $TAILGATE_BENCH_SIDE > " + marker + "; echo gpu-7", Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr.String())
	}
	if got, _ := os.ReadFile(marker); string(got) != "1 A\n" {
		t.Errorf("hook wrote %q", got)
	}
	if !strings.Contains(stdout.String(), "== failover: kill at") || !strings.Contains(stdout.String(), "(gpu-7)") {
		t.Errorf("stdout:\n%s", stdout.String())
	}
}

// TestMainTakesTheFirstModelTheTargetLists: without a model, the first of
// GET /v1/models is asked for, and stderr says so.
func TestMainTakesTheFirstModelTheTargetLists(t *testing.T) {
	var mu sync.Mutex
	var auth, models []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		auth = append(auth, r.Header.Get("Authorization"))
		if r.URL.Path == "/v1/models" {
			_, _ = io.WriteString(w, `{"data":[{"id":"first"},{"id":"second"}]}`)
			return
		}
		var body struct{ Model string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		models = append(models, body.Model)
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":1}}`)
	}))
	defer srv.Close()
	keyFile := filepath.Join(t.TempDir(), "team.key")
	if err := os.WriteFile(keyFile, []byte("sk-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	err := Main(context.Background(), Options{A: Side{Target: srv.URL + "/v1/", KeyFile: keyFile},
		Phases: "steady:200ms", Rate: 20, StreamFraction: fraction(0), Stderr: &stderr})
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(models) == 0 || slices.ContainsFunc(models, func(m string) bool { return m != "first" }) {
		t.Errorf("requests asked for %v", models)
	}
	if slices.ContainsFunc(auth, func(h string) bool { return h != "Bearer sk-file" }) {
		t.Errorf("authorization headers %v: want the key file's trimmed content", auth)
	}
	if !strings.Contains(stderr.String(), `bench: model "first" (the first the target lists; --model to choose)`) {
		t.Errorf("stderr:\n%s", stderr.String())
	}
}

// TestMainInterruptedStillReports: a run cancelled midway prints the report
// of what it saw, with a note, and returns "interrupted".
func TestMainInterruptedStillReports(t *testing.T) {
	a := newOpenAIStub(t, time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(300*time.Millisecond, cancel)
	var stdout bytes.Buffer
	err := Main(ctx, Options{A: Side{Target: a.srv.URL + "/v1", Model: "m"}, Phases: "steady:20s", Rate: 20, Stdout: &stdout})
	if err == nil || err.Error() != "interrupted" {
		t.Fatalf("Main returned %v, want interrupted", err)
	}
	if !strings.Contains(stdout.String(), "the run was stopped early") || !strings.Contains(stdout.String(), "== summary ==") {
		t.Errorf("stdout:\n%s", stdout.String())
	}
}

// TestMainRefusesBeforeSending: invalid options and an unreadable replay
// file are reported before any request is sent.
func TestMainRefusesBeforeSending(t *testing.T) {
	a := newOpenAIStub(t, 0)
	for name, o := range map[string]Options{
		"bad phases":        {A: Side{Target: a.srv.URL + "/v1", Model: "m"}, Phases: "steady"},
		"missing replay":    {A: Side{Target: a.srv.URL + "/v1", Model: "m"}, Phases: "steady:1s", Replay: filepath.Join(t.TempDir(), "nope.jsonl")},
		"B target mistyped": {A: Side{Target: a.srv.URL + "/v1", Model: "m"}, B: Side{Target: "localhost:8000/v1"}, Phases: "steady:1s"},
	} {
		if err := Main(context.Background(), o); err == nil {
			t.Errorf("%s: ran", name)
		}
	}
	if n := len(a.sorted()); n != 0 {
		t.Errorf("%d requests sent", n)
	}
}
