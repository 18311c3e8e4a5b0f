package sim

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// With priority scheduling a request of a lower priority value is served
// before the waiting requests of higher values that arrived before it, as
// vLLM's PriorityRequestQueue orders them; those of one value keep their
// arrival order.
func TestPrioritySchedulingServesLowerValuesFirst(t *testing.T) {
	e, srv := start(t, Config{Model: "m", MaxSeqs: 1, TTFT: 20 * time.Millisecond, TTFTSigma: -1, TPOT: 10 * time.Millisecond, PriorityScheduling: true})
	chat := srv.URL + "/v1/chat/completions"

	blockCtx, unblock := context.WithCancel(context.Background())
	defer unblock()
	openStream(t, blockCtx, chat, `{"messages":[{"role":"user","content":"block"}],"max_tokens":1000,"ignore_eos":true,"stream":true}`)
	testkit.WaitFor(t, "the blocker to run", func() bool { return e.Stats().Running == 1 })

	// Three batch requests (priority 1) queue, then one urgent (-1) and one
	// default (0, no field).
	bodies := []string{
		`{"messages":[{"role":"user","content":"b0"}],"max_tokens":1,"priority":1}`,
		`{"messages":[{"role":"user","content":"b1"}],"max_tokens":1,"priority":1}`,
		`{"messages":[{"role":"user","content":"b2"}],"max_tokens":1,"priority":1}`,
		`{"messages":[{"role":"user","content":"urgent"}],"max_tokens":1,"priority":-1}`,
		`{"messages":[{"role":"user","content":"default"}],"max_tokens":1}`,
	}
	rank := make([]int64, len(bodies)) // completions counted when each answer arrived
	var wg sync.WaitGroup
	for i, b := range bodies {
		wg.Go(func() {
			status, _, body := post(t, chat, b)
			rank[i] = e.Stats().Completed
			if status != http.StatusOK {
				t.Errorf("request %d: status %d: %s", i, status, body)
			}
		})
		testkit.WaitFor(t, "the request to queue", func() bool { return e.Stats().Waiting == i+1 })
	}
	unblock()
	wg.Wait()
	// Served one at a time: urgent, default, then the batch ones in order.
	want := []int64{3, 4, 5, 1, 2}
	for i := range want {
		if rank[i] != want[i] {
			t.Errorf("served order (completions when each answered) = %v, want %v", rank, want)
			break
		}
	}
}

// Without priority scheduling (vLLM's default, fcfs) a priority other than
// 0 is refused with 400, as vLLM refuses it; 0 is served.
func TestFCFSRefusesAPriority(t *testing.T) {
	_, srv := start(t, Config{Model: "m", TTFT: time.Millisecond, TTFTSigma: -1})
	status, _, body := post(t, srv.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":1,"priority":-1}`)
	if status != http.StatusBadRequest || !strings.Contains(string(body), "Priority scheduling is not enabled") {
		t.Errorf("priority -1 on fcfs: %d %s, want 400 saying priority scheduling is not enabled", status, body)
	}
	status, _, body = post(t, srv.URL+"/v1/completions", `{"prompt":"x","max_tokens":1,"priority":0}`)
	if status != http.StatusOK {
		t.Errorf("priority 0 on fcfs: %d %s, want 200", status, body)
	}
}
