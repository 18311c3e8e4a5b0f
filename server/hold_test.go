package server_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// coldGateway is a gateway whose one replica is starting (registered, not
// ready): requests for its model are held.
func coldGateway(t *testing.T, hold server.HoldConfig) (*servertest.Gateway, *router.Replica, string) {
	t.Helper()
	g := servertest.Start(t, servertest.Options{Replicas: 1, Server: server.Config{Hold: hold}})
	rep := g.Reg.Get("sim-a")
	if rep == nil || !rep.SetState(router.StateStarting, "engine loading") {
		t.Fatal("cannot put the replica back to starting")
	}
	return g, rep, g.Key(policy.KeyOptions{})
}

func waitHeld(t *testing.T, g *servertest.Gateway, n int) {
	t.Helper()
	for range 500 {
		if g.Reg.Waiting(servertest.SimModel) == n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("never saw %d requests held (have %d)", n, g.Reg.Waiting(servertest.SimModel))
}

const holdBody = `{"model":"tailgate-sim","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
const holdStreamBody = `{"model":"tailgate-sim","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hi"}]}`

func TestHeldStreamGetsProgressThenTokens(t *testing.T) {
	g, rep, key := coldGateway(t, server.HoldConfig{Progress: 10 * time.Millisecond})
	resp := g.Post("/v1/chat/completions", key, holdStreamBody)
	defer resp.Body.Close()
	// Progress comments commit the 200 before any replica is ready.
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, ": waiting for a replica of tailgate-sim: starting, ") {
		t.Fatalf("first line %q (%v), want a progress comment", line, err)
	}
	rep.SetState(router.StateReady, "")
	rest, err := io.ReadAll(rd)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rest), `"content"`) || !strings.HasSuffix(strings.TrimSpace(string(rest)), "data: [DONE]") {
		t.Fatalf("after release the stream has no tokens or no [DONE]:\n%s", rest)
	}
	rows := g.LedgerRows()
	if len(rows) != 1 || rows[0].Status != 200 || rows[0].Outcome != data.OutcomeOK {
		t.Fatalf("ledger %+v, want one ok row", rows)
	}
	if rows[0].Stages.Hold <= 0 || rows[0].Stages.Hold > rows[0].Stages.Total {
		t.Fatalf("hold stage %v (total %v), want the wait recorded", rows[0].Stages.Hold, rows[0].Stages.Total)
	}
	if rows[0].Stages.Gateway > rows[0].Stages.Total-rows[0].Stages.Hold {
		t.Fatalf("gateway stage %v includes the hold %v", rows[0].Stages.Gateway, rows[0].Stages.Hold)
	}
	if n := stageCount(t, g, "hold"); n != 1 {
		t.Fatalf("tailgate_stage_duration_seconds{stage=\"hold\"} count %d, want 1", n)
	}
}

func TestHeldJSONRequestWaitsForReplica(t *testing.T) {
	g, rep, key := coldGateway(t, server.HoldConfig{})
	got := make(chan *http.Response, 1)
	go func() { got <- g.Post("/v1/chat/completions", key, holdBody) }()
	waitHeld(t, g, 1)
	select {
	case r := <-got:
		t.Fatalf("answered %d while no replica was ready", r.StatusCode)
	default:
	}
	rep.SetState(router.StateReady, "")
	resp := <-got
	defer resp.Body.Close()
	var body struct {
		Choices []json.RawMessage `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 200 || len(body.Choices) != 1 {
		t.Fatalf("status %d, %v, %d choices", resp.StatusCode, err, len(body.Choices))
	}
	if !strings.Contains(resp.Header.Get("Server-Timing"), "hold;dur=") {
		t.Fatalf("Server-Timing %q has no hold stage", resp.Header.Get("Server-Timing"))
	}
}

func TestHoldQueueFullIs429AndTimeoutIs503(t *testing.T) {
	g, _, key := coldGateway(t, server.HoldConfig{Queue: 1, Timeout: 300 * time.Millisecond})
	first := make(chan *http.Response, 1)
	go func() { first <- g.Post("/v1/chat/completions", key, holdBody) }()
	waitHeld(t, g, 1)
	full := g.Post("/v1/chat/completions", key, holdBody)
	full.Body.Close()
	if full.StatusCode != http.StatusTooManyRequests || full.Header.Get("Retry-After") == "" {
		t.Fatalf("past the queue: %d Retry-After %q, want 429 with Retry-After", full.StatusCode, full.Header.Get("Retry-After"))
	}
	late := <-first
	b, _ := io.ReadAll(late.Body)
	late.Body.Close()
	if late.StatusCode != http.StatusServiceUnavailable || late.Header.Get("Retry-After") == "" || !strings.Contains(string(b), `"no_replica"`) {
		t.Fatalf("past the deadline: %d Retry-After %q %s, want 503 no_replica with Retry-After", late.StatusCode, late.Header.Get("Retry-After"), b)
	}
	codes := map[string]int{}
	for _, r := range g.LedgerRows() {
		codes[string(r.Error)] = r.Status
	}
	if codes["queue_full"] != 429 || codes["no_replica"] != 503 {
		t.Fatalf("ledger classes %v, want queue_full 429 and no_replica 503", codes)
	}
}

func TestHeldStreamTimeoutIsAnInBandError(t *testing.T) {
	g, _, key := coldGateway(t, server.HoldConfig{Timeout: 200 * time.Millisecond, Progress: 10 * time.Millisecond})
	resp := g.Post("/v1/chat/completions", key, holdStreamBody)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.HasPrefix(string(b), ": waiting for a replica") || !strings.Contains(string(b), `data: {"error":`) || !strings.Contains(string(b), "no_replica") {
		t.Fatalf("status %d body:\n%s\nwant progress comments then an in-band no_replica error event", resp.StatusCode, b)
	}
}

func TestNoHoldWhenNothingIsComing(t *testing.T) {
	g, rep, key := coldGateway(t, server.HoldConfig{})
	rep.SetState(router.StateFailed, "crashed")
	resp := g.Post("/v1/chat/completions", key, holdBody)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503 at once", resp.StatusCode)
	}
}

// stageCount is the sample count of tailgate_stage_duration_seconds{stage}.
func stageCount(t *testing.T, g *servertest.Gateway, stage string) uint64 {
	t.Helper()
	mfs, err := g.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tailgate_stage_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelIs(m, "stage", stage) {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}

func labelIs(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// TestRequestThatEveryReplicaDeclinesWaitsForTheOneComing: the only ready
// replica began draining (a preemption notice) just as the request reached
// it, while a replacement is starting. Nothing ran, so the request waits
// for the replacement as one that found no replica does, and is answered
// by it — not refused with 503 no_replica.
func TestRequestThatEveryReplicaDeclinesWaitsForTheOneComing(t *testing.T) {
	g, rep, key := coldGateway(t, server.HoldConfig{})
	var declined atomic.Int64
	fakeEngine(t, g, "preempted", func(w http.ResponseWriter, r *http.Request) {
		declined.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"message":"draining","type":"server_error","param":null,"code":"replica_draining"}}`)
	})
	g.Reg.Get("preempted").SetModels([]string{servertest.SimModel})
	got := make(chan *http.Response, 1)
	go func() { got <- g.Post("/v1/chat/completions", key, holdBody) }()
	for i := 0; i < 500 && g.Reg.Waiting(servertest.SimModel) == 0; i++ {
		select {
		case r := <-got:
			raw, _ := io.ReadAll(r.Body)
			t.Fatalf("answered %d before the replacement was ready: %s", r.StatusCode, raw)
		case <-time.After(10 * time.Millisecond):
		}
	}
	waitHeld(t, g, 1)
	if declined.Load() != 1 {
		t.Fatalf("the draining replica was asked %d times, want 1", declined.Load())
	}
	rep.SetState(router.StateReady, "")
	resp := <-got
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("x-tailgate-replica") != "sim-a" {
		t.Fatalf("status %d from %q: %s; want 200 from the replica that was starting", resp.StatusCode, resp.Header.Get("x-tailgate-replica"), raw)
	}
	rows := g.LedgerRows()
	if len(rows) != 1 || rows[0].Outcome != data.OutcomeOK || rows[0].Attempts != 2 || rows[0].Stages.Hold <= 0 {
		t.Fatalf("ledger %+v, want one ok row with both attempts and the hold", rows)
	}
}
