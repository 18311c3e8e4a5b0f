package load

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestOpenLoopSendsOnScheduleWhileServerStalls: a server that answers
// nothing until every request of the schedule has arrived still receives all
// of them — the client does not wait for answers before sending — and each
// was sent close to its intended time; the wait shows in the latency.
func TestOpenLoopSendsOnScheduleWhileServerStalls(t *testing.T) {
	plan := mustPlan(t, "steady:400ms")
	const rate, seed = 50, 3
	want := len(OpenLoop(plan, rate, seed))
	if want < 10 {
		t.Fatalf("schedule has only %d arrivals", want)
	}
	var (
		mu       sync.Mutex
		arrived  int
		released = make(chan struct{})
		releasAt time.Time
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		mu.Lock()
		arrived++
		if arrived == want {
			releasAt = time.Now()
			close(released)
		}
		mu.Unlock()
		select {
		case <-released:
		case <-time.After(10 * time.Second): // bounded, should the client never send them all
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}]}`)
	}))
	defer srv.Close()

	res, err := Run(context.Background(), Config{Target: Target{BaseURL: srv.URL + "/v1"}, Workload: smallWorkload(t, 0),
		Plan: plan, Rate: rate, Seed: seed, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-released:
	default:
		t.Fatalf("the server got %d of %d requests while it held every answer: the client waited for answers", arrived, want)
	}
	if len(res.Records) != want {
		t.Fatalf("%d records, schedule has %d", len(res.Records), want)
	}
	release := releasAt.Sub(res.Start)
	for _, r := range res.Records {
		if !r.OK() {
			t.Fatalf("request %d failed: %s", r.Index, r.ErrClass)
		}
		if lag := r.Sent - r.Intended; lag < 0 || lag > 250*time.Millisecond {
			t.Errorf("request %d sent %v after its intended time", r.Index, lag)
		}
		// Latency counts from the intended time, so it covers the stall.
		if r.Intended+r.TTFT < release {
			t.Errorf("request %d: intended %v + ttft %v ends before the server answered at %v", r.Index, r.Intended, r.TTFT, release)
		}
	}
}

// TestLatencyCountsFromIntendedSendTime: with one connection and a server
// that takes 100ms per request, requests queue in the client; each one's
// latency includes its wait, as a user's would.
func TestLatencyCountsFromIntendedSendTime(t *testing.T) {
	plan := mustPlan(t, "steady:10ms")
	seed := int64(1)
	for len(OpenLoop(plan, 500, seed)) < 4 {
		seed++
	}
	n := len(OpenLoop(plan, 500, seed))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		time.Sleep(100 * time.Millisecond)
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}]}`)
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{Target: Target{BaseURL: srv.URL + "/v1"}, Workload: smallWorkload(t, 0),
		Plan: plan, Rate: 500, Seed: seed, MaxConns: 1, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var ttfts []time.Duration
	for _, r := range res.Records {
		if !r.OK() {
			t.Fatalf("request failed: %s", r.ErrClass)
		}
		ttfts = append(ttfts, r.TTFT)
	}
	slices.Sort(ttfts)
	if len(ttfts) != n {
		t.Fatalf("%d answers of %d", len(ttfts), n)
	}
	// The k-th answer (from 0) cannot come before k+1 server delays, less
	// the 10ms the arrivals are spread over.
	for k, d := range ttfts {
		if min := time.Duration(k+1)*100*time.Millisecond - 10*time.Millisecond; d < min {
			t.Errorf("answer %d: ttft %v, less than the %v it queued and was served", k, d, min)
		}
	}
}

// TestClosedLoopKeepsConcurrency: N clients never have more than N requests
// open, and do reach N.
func TestClosedLoopKeepsConcurrency(t *testing.T) {
	var open, peak atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		n := open.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(15 * time.Millisecond)
		open.Add(-1)
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}]}`)
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{Target: Target{BaseURL: srv.URL + "/v1"}, Workload: smallWorkload(t, 0),
		Plan: mustPlan(t, "steady:300ms"), Concurrency: 3})
	if err != nil {
		t.Fatal(err)
	}
	if p := peak.Load(); p != 3 {
		t.Fatalf("peak of %d open requests with 3 clients", p)
	}
	idx := map[int]bool{}
	for _, r := range res.Records {
		if idx[r.Index] {
			t.Fatalf("request %d sent twice", r.Index)
		}
		idx[r.Index] = true
		if r.Sent < r.Intended {
			t.Fatalf("request %d sent at %v, before its intended time %v", r.Index, r.Sent, r.Intended)
		}
	}
	for i := range len(res.Records) {
		if !idx[i] {
			t.Fatalf("request %d of %d missing: the clients do not share one sequence", i, len(res.Records))
		}
	}
}
