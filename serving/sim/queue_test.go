package sim

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// openStream starts a streaming chat request and returns its reader once the
// headers are in; cancel disconnects the client.
func openStream(t *testing.T, ctx context.Context, url, body string) *bufio.Reader {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("open stream: %v", err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream status %d", resp.StatusCode)
	}
	return bufio.NewReader(resp.Body)
}

func TestQueueServesInFIFOOrder(t *testing.T) {
	e, srv := start(t, Config{Model: "m", MaxSeqs: 1, TTFT: 50 * time.Millisecond, TTFTSigma: -1, TPOT: 50 * time.Millisecond})
	chat := srv.URL + "/v1/chat/completions"

	// A long stream holds the only slot until the test lets it go.
	blockCtx, unblock := context.WithCancel(context.Background())
	defer unblock()
	openStream(t, blockCtx, chat, `{"messages":[{"role":"user","content":"block"}],"max_tokens":1000,"ignore_eos":true,"stream":true}`)
	testkit.WaitFor(t, "the blocker to run", func() bool { return e.Stats().Running == 1 })

	// Three requests queue behind it, in a known order.
	const queued = 3
	completedAtAnswer := make([]int64, queued)
	var wg sync.WaitGroup
	for i := range queued {
		wg.Go(func() {
			status, _, body := post(t, chat, `{"messages":[{"role":"user","content":"q"}],"max_tokens":1}`)
			completedAtAnswer[i] = e.Stats().Completed
			if status != http.StatusOK {
				t.Errorf("request %d: status %d: %s", i, status, body)
			}
		})
		testkit.WaitFor(t, "the request to queue", func() bool { return e.Stats().Waiting == i+1 })
	}

	_, metrics := get(t, srv.URL+"/metrics")
	for name, want := range map[string]float64{
		`vllm:num_requests_running{engine="0",model_name="m"}`: 1,
		`vllm:num_requests_waiting{engine="0",model_name="m"}`: queued,
		`vllm:kv_cache_usage_perc{engine="0",model_name="m"}`:  1,
	} {
		if got := metricValue(t, metrics, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}

	unblock()
	wg.Wait()
	// Each answer is written after its request completed; in FIFO order the
	// i-th queued request cannot finish before the ones ahead of it.
	for i, c := range completedAtAnswer {
		if c < int64(i+1) {
			t.Errorf("request %d answered when only %d requests had completed: served out of order", i, c)
		}
	}
	testkit.WaitFor(t, "the engine to drain", func() bool { s := e.Stats(); return s.Running == 0 && s.Waiting == 0 })
	if s := e.Stats(); s.Completed != queued || s.Aborted != 1 {
		t.Errorf("stats = %+v, want %d completed and the blocker aborted", s, queued)
	}
	_, metrics = get(t, srv.URL+"/metrics")
	if got := metricValue(t, metrics, `vllm:num_requests_running{engine="0",model_name="m"}`); got != 0 {
		t.Errorf("running gauge = %v after drain", got)
	}
	if got := metricValue(t, metrics, `vllm:request_queue_time_seconds_count{engine="0",model_name="m"}`); got != queued+1 {
		t.Errorf("queue time observations = %v, want %d", got, queued+1)
	}
}

func TestDisconnectAbortsAndFreesTheSlot(t *testing.T) {
	e, srv := start(t, Config{Model: "m", MaxSeqs: 1, TPOT: time.Hour})
	chat := srv.URL + "/v1/chat/completions"

	// A stream that got its first token and now waits an hour for the next.
	streamCtx, disconnect := context.WithCancel(context.Background())
	defer disconnect()
	r := openStream(t, streamCtx, chat, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"ignore_eos":true,"stream":true}`)
	readEvent(t, r) // role
	readEvent(t, r) // first token

	// A queued request whose client gives up.
	queuedCtx, giveUp := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(queuedCtx, http.MethodPost, chat, strings.NewReader(`{"messages":[{"role":"user","content":"q"}]}`))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("queued request answered %d despite its client leaving", resp.StatusCode)
		}
	}()
	testkit.WaitFor(t, "the request to queue", func() bool { return e.Stats().Waiting == 1 })
	giveUp()
	<-done
	testkit.WaitFor(t, "the queued request to abort", func() bool { s := e.Stats(); return s.Aborted == 1 && s.Waiting == 0 })

	disconnect()
	testkit.WaitFor(t, "the stream to abort", func() bool { s := e.Stats(); return s.Aborted == 2 && s.Running == 0 })

	// The slot is free again: a short request is served at once.
	status, _, body := post(t, chat, `{"messages":[{"role":"user","content":"after"}],"max_tokens":1}`)
	if status != http.StatusOK {
		t.Fatalf("after aborts: status %d: %s", status, body)
	}
	if s := e.Stats(); s.Completed != 1 || s.Aborted != 2 || s.Running != 0 {
		t.Errorf("stats = %+v", s)
	}
	_, metrics := get(t, srv.URL+"/metrics")
	if got := metricValue(t, metrics, `tailgate_sim_aborted_total{engine="0",model_name="m"}`); got != 2 {
		t.Errorf("tailgate_sim_aborted_total = %v, want 2", got)
	}
	if got := metricValue(t, metrics, `vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"}`); got != 2 {
		t.Errorf("aborted success count = %v, want 2", got)
	}
}

func TestQueueTimeIsReported(t *testing.T) {
	e, srv := start(t, Config{Model: "m", MaxSeqs: 1, TPOT: time.Hour})
	chat := srv.URL + "/v1/chat/completions"

	// The stream's 200 comes before its slot, so its queue time is a comment
	// just before the first token event.
	blockCtx, unblock := context.WithCancel(context.Background())
	defer unblock()
	r := openStream(t, blockCtx, chat, `{"messages":[{"role":"user","content":"block"}],"max_tokens":2,"ignore_eos":true,"stream":true}`)
	var lines []string
	for len(lines) < 6 {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read stream: %v (so far %q)", err, lines)
		}
		lines = append(lines, line)
	}
	if !strings.Contains(lines[0], `"role":"assistant"`) || lines[1] != "\n" {
		t.Fatalf("stream opens with %q, want the role event", lines[:2])
	}
	ms, ok := strings.CutPrefix(strings.TrimSuffix(lines[2], "\n"), ": sim-queue-ms=")
	if !ok || lines[3] != "\n" {
		t.Fatalf("third event %q, want the queue-time comment", lines[2:4])
	}
	if v, err := strconv.ParseFloat(ms, 64); err != nil || v < 0 {
		t.Errorf("stream queue time %q", ms)
	}
	if !strings.Contains(lines[4], `"content":"`) || lines[5] != "\n" {
		t.Errorf("event after the comment = %q, want the first token", lines[4])
	}

	// A JSON answer queued behind the stream says how long it waited.
	var hdr http.Header
	done := make(chan struct{})
	go func() {
		defer close(done)
		var status int
		status, hdr, _ = post(t, chat, `{"messages":[{"role":"user","content":"q"}],"max_tokens":1}`)
		if status != http.StatusOK {
			t.Errorf("queued request: status %d", status)
		}
	}()
	testkit.WaitFor(t, "the request to queue", func() bool { return e.Stats().Waiting == 1 })
	unblock()
	<-done
	if hdr == nil {
		return
	}
	v, err := strconv.ParseFloat(hdr.Get("X-Sim-Queue-Ms"), 64)
	if err != nil || v <= 0 {
		t.Errorf("X-Sim-Queue-Ms = %q, want a positive number of milliseconds", hdr.Get("X-Sim-Queue-Ms"))
	}
}
