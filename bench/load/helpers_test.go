package load

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeGateway imitates a tailgate gateway in front of named replicas: chat
// completions as JSON (with Server-Timing) or SSE, the route headers, and the
// admin API's replica list and recent requests. A killed replica cuts its
// open requests (mid-stream when a token was sent) and, like a gateway that
// has not noticed yet, still gets the next deadRouting requests, which fail
// with 502. Every failure it causes is counted, so tests can hold the
// report's figures against them.
type fakeGateway struct {
	api, admin *httptest.Server

	ttft        time.Duration
	chunks      int
	chunkEvery  time.Duration
	deadRouting int

	mu       sync.Mutex
	replicas []*fakeReplica
	rr       int
	seq      int
	stages   map[string]fakeStage // streams' stage timings, for the admin API
	// what it did
	rejected502, cutBefore, cutMid, served int
}

type fakeReplica struct {
	id          string
	readyAt     time.Time
	killed      bool
	pendingDead int
	dead        chan struct{}
	inflight    int
}

type fakeStage struct {
	replica string
	stages  map[string]float64
}

func (r *fakeReplica) ready(now time.Time) bool {
	return (!r.killed || r.pendingDead > 0) && !now.Before(r.readyAt)
}

const fakeAdminToken = "tga-test"

func newFakeGateway(t *testing.T, replicas ...string) *fakeGateway {
	g := &fakeGateway{ttft: 20 * time.Millisecond, chunks: 4, chunkEvery: 15 * time.Millisecond, stages: map[string]fakeStage{}}
	for _, id := range replicas {
		g.add(id, time.Time{})
	}
	api := http.NewServeMux()
	api.HandleFunc("POST /v1/chat/completions", g.serveChat)
	api.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"fake-model","object":"model"}]}`)
	})
	adm := http.NewServeMux()
	adm.HandleFunc("GET /admin/v1/replicas", g.serveReplicas)
	adm.HandleFunc("GET /admin/v1/requests", g.serveRequests)
	g.api = httptest.NewServer(api)
	g.admin = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+fakeAdminToken {
			http.Error(w, `{"error":{"message":"bad admin token"}}`, http.StatusUnauthorized)
			return
		}
		adm.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { g.api.Close(); g.admin.Close() })
	return g
}

func (g *fakeGateway) target() Target {
	return Target{Label: "fake", BaseURL: g.api.URL + "/v1", Key: "k", AdminURL: g.admin.URL, AdminToken: fakeAdminToken}
}

func (g *fakeGateway) add(id string, readyAt time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.replicas = append(g.replicas, &fakeReplica{id: id, readyAt: readyAt, dead: make(chan struct{})})
}

// kill takes the first live replica down and returns its id.
func (g *fakeGateway) kill() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range g.replicas {
		if !r.killed {
			r.killed, r.pendingDead = true, g.deadRouting
			close(r.dead)
			return r.id
		}
	}
	return ""
}

// pick chooses a replica: a killed one still owed dead routing first, else
// round robin over the ready ones.
func (g *fakeGateway) pick() (rep *fakeReplica, dead bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range g.replicas {
		if r.killed && r.pendingDead > 0 {
			r.pendingDead--
			g.rejected502++
			return r, true
		}
	}
	now := time.Now()
	var ready []*fakeReplica
	for _, r := range g.replicas {
		if r.ready(now) {
			ready = append(ready, r)
		}
	}
	if len(ready) == 0 {
		return nil, false
	}
	g.rr++
	rep = ready[g.rr%len(ready)]
	rep.inflight++
	return rep, false
}

func (g *fakeGateway) done(rep *fakeReplica, counter *int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	rep.inflight--
	if counter != nil {
		*counter++
	}
}

func (g *fakeGateway) serveChat(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Stream bool `json:"stream"`
	}
	body, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(body, &req)
	g.mu.Lock()
	g.seq++
	id := fmt.Sprintf("req_%d", g.seq)
	g.mu.Unlock()
	h := w.Header()
	h.Set("X-Request-Id", id)
	rep, dead := g.pick()
	if rep == nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":{"message":"no ready replica","type":"server_error","code":"no_ready_replica"}}`)
		return
	}
	h.Set("X-Tailgate-Replica", rep.id)
	h.Set("X-Tailgate-Attempts", "1")
	if dead {
		w.WriteHeader(http.StatusBadGateway)
		_, _ = io.WriteString(w, `{"error":{"message":"replica failed","type":"server_error","code":"upstream_error"}}`)
		return
	}
	select {
	case <-time.After(g.ttft):
	case <-rep.dead:
		g.done(rep, &g.cutBefore)
		panic(http.ErrAbortHandler)
	}
	if !req.Stream {
		h.Set("Content-Type", "application/json")
		h.Set("Server-Timing", "gateway;dur=0.250, connect;dur=0.000, upstream_ttft;dur=20.500, ttft;dur=21.000, total;dur=21.000")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"lorem ipsum"},"finish_reason":"length"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`)
		g.done(rep, &g.served)
		return
	}
	h.Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for i := range g.chunks {
		if i > 0 {
			select {
			case <-time.After(g.chunkEvery):
			case <-rep.dead:
				g.done(rep, &g.cutMid)
				panic(http.ErrAbortHandler)
			}
		}
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"w%d \"}}]}\n\n", i)
		fl.Flush()
	}
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", g.chunks)
	g.mu.Lock()
	g.stages[id] = fakeStage{replica: rep.id, stages: map[string]float64{"gateway": 0.5, "upstream_ttft": 20, "ttft": 21}}
	g.mu.Unlock()
	g.done(rep, &g.served)
}

func (g *fakeGateway) serveReplicas(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	out := []map[string]any{}
	for _, rep := range g.replicas {
		state := "ready"
		switch {
		case rep.killed && rep.pendingDead == 0:
			state = "ejected"
		case now.Before(rep.readyAt):
			state = "warming"
		}
		out = append(out, map[string]any{"id": rep.id, "state": state, "ready": state == "ready", "inflight": rep.inflight,
			"engine_waiting": float64(max(rep.inflight-1, 0)), "engine_running": float64(min(rep.inflight, 1))})
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"data": out})
}

func (g *fakeGateway) serveRequests(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := []map[string]any{}
	for id, st := range g.stages {
		out = append(out, map[string]any{"id": id, "replica": st.replica, "attempts": 1, "stages_ms": st.stages})
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"data": out})
}

// fakeFleet acts on a fakeGateway: a kill takes a replica down and starts a
// replacement, a scale-out adds replicas; new replicas are ready after
// warmup.
type fakeFleet struct {
	g      *fakeGateway
	warmup time.Duration

	mu    sync.Mutex
	calls []string
	next  int
}

func (f *fakeFleet) start() Replacement {
	f.mu.Lock()
	f.next++
	id := fmt.Sprintf("new-%d", f.next)
	f.mu.Unlock()
	now := time.Now()
	f.g.add(id, now.Add(f.warmup))
	return Replacement{ID: id, At: now}
}

func (f *fakeFleet) Kill(ctx context.Context, n int) (ActionResult, error) {
	f.mu.Lock()
	f.calls = append(f.calls, fmt.Sprintf("kill %d", n))
	f.mu.Unlock()
	var res ActionResult
	for range n {
		res.Replicas = append(res.Replicas, f.g.kill())
		res.Replacements = append(res.Replacements, f.start())
	}
	return res, nil
}

func (f *fakeFleet) ScaleOut(ctx context.Context, n int) (ActionResult, error) {
	f.mu.Lock()
	f.calls = append(f.calls, fmt.Sprintf("scaleout %d", n))
	f.mu.Unlock()
	var res ActionResult
	for range n {
		res.Replicas = append(res.Replicas, f.start().ID)
	}
	return res, nil
}

func mustPlan(t *testing.T, s string) Plan {
	t.Helper()
	ps, err := ParsePhases(s)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPlan(ps)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// streamsOnly is a workload of short requests, all streams or none.
func smallWorkload(t *testing.T, streamFraction float64) *Workload {
	t.Helper()
	w, err := NewWorkload(WorkloadConfig{Model: "fake-model", Prompt: Dist{Kind: "fixed", A: 16}, Output: Dist{Kind: "fixed", A: 4},
		StreamFraction: streamFraction, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func errorsIn(recs []Record) (n int, byClass map[string]int) {
	byClass = map[string]int{}
	for i := range recs {
		if !recs[i].OK() {
			n++
			byClass[recs[i].ErrClass]++
		}
	}
	return n, byClass
}

func joinIDs(ids []string) string { return strings.Join(ids, ",") }
