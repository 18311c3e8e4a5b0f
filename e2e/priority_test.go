package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// A key's priority class becomes the engine's request priority on a worker
// whose engine runs with priority scheduling: on a saturated replica an
// interactive key's request overtakes the batch key's requests queued in
// the engine before it. The gateway's own admission queue is out of the way
// (--admit-capacity far above the engine's one slot), so only the engine
// can reorder.
func TestInteractiveKeyOvertakesQueuedBatchInTheEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the binary")
	}
	g := startGateway(t, "--admit-capacity", "1000")
	interactive := testkit.LastLine(tailgate(t, "keys", "create", "--data", g.dir, "--tenant", "app", "--class", "interactive"))
	batch := testkit.LastLine(tailgate(t, "keys", "create", "--data", g.dir, "--tenant", "jobs", "--class", "batch"))
	g.startWorker("w1", "--engine-priority-scheduling", "--sim-max-seqs", "1", "--sim-tpot", "10ms")
	g.waitReady("w1")
	if !g.priorityScheduling("w1") {
		t.Error("GET /admin/v1/replicas: w1 without priority_scheduling: true")
	}

	// The engine's one slot is held by a long batch stream.
	hold, release := context.WithCancel(t.Context())
	defer release()
	resp := g.post(hold, batch, `{"model":"tailgate-sim","stream":true,"max_tokens":3000,"ignore_eos":true,"messages":[{"role":"user","content":"hold the slot"}]}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("holder: status %d", resp.StatusCode)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, resp.Body); resp.Body.Close() }()

	var (
		mu    sync.Mutex
		order []string
		wg    sync.WaitGroup
	)
	send := func(name, key string) {
		wg.Go(func() {
			r := g.post(t.Context(), key, fmt.Sprintf(`{"model":"tailgate-sim","max_tokens":1,"messages":[{"role":"user","content":"%s"}]}`, name))
			body, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if r.StatusCode != http.StatusOK {
				t.Errorf("%s: status %d: %s", name, r.StatusCode, body)
			}
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
		})
	}
	for i := range 3 {
		send(fmt.Sprintf("batch-%d", i), batch)
	}
	testkit.WaitWithin(t, 30*time.Second, "3 batch requests waiting in the engine", func() bool { return g.engineWaiting("w1") == 3 })
	send("interactive", interactive)
	testkit.WaitWithin(t, 30*time.Second, "the interactive request waiting in the engine", func() bool { return g.engineWaiting("w1") == 4 })
	release()
	wg.Wait()
	if len(order) != 4 || order[0] != "interactive" {
		t.Errorf("answered in the order %v, want the interactive request first", order)
	}
}

// A worker without --engine-priority-scheduling gets no priority field: its
// engine (vLLM's default policy, fcfs) would refuse one with 400, and the
// keys of every class are served. A client's own priority field is
// replaced by the key's class, never sent as it is.
func TestNoPriorityToAnEngineWithoutPriorityScheduling(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the binary")
	}
	g := startGateway(t)
	g.startFleet(1)
	if g.priorityScheduling("w1") {
		t.Error("GET /admin/v1/replicas: w1 started without the flag says priority_scheduling: true")
	}
	for _, class := range []string{"interactive", "standard", "batch"} {
		key := testkit.LastLine(tailgate(t, "keys", "create", "--data", g.dir, "--tenant", class, "--class", class))
		r := g.post(t.Context(), key, `{"model":"tailgate-sim","max_tokens":1,"priority":-5,"messages":[{"role":"user","content":"hi"}]}`)
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != http.StatusOK {
			t.Errorf("%s key on an fcfs engine: status %d: %s", class, r.StatusCode, body)
		}
	}
}

// post sends body to /v1/chat/completions with key.
func (g *gatewayProcess) post(ctx context.Context, key, body string) *http.Response {
	g.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.api+"/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	return resp
}

// engineWaiting is the replica's engine queue as its last heartbeat said.
func (g *gatewayProcess) engineWaiting(id string) float64 {
	g.t.Helper()
	return g.replicaRow(id).Waiting
}

// priorityScheduling is the replica's priority_scheduling as the admin API
// lists it.
func (g *gatewayProcess) priorityScheduling(id string) bool {
	g.t.Helper()
	return g.replicaRow(id).Priority
}

type replicaRow struct {
	ID       string  `json:"id"`
	Waiting  float64 `json:"engine_waiting"`
	Priority bool    `json:"priority_scheduling"`
}

func (g *gatewayProcess) replicaRow(id string) replicaRow {
	g.t.Helper()
	for _, r := range replicasAs[replicaRow](g) {
		if r.ID == id {
			return r
		}
	}
	return replicaRow{ID: id, Waiting: -1}
}
