package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tailgate-dev/tailgate/server/apierr"
)

// bodyBudget bounds the request-body bytes the gateway holds at once, over
// all requests (Config.MaxBodyBytesInFlight): each request's own bound
// (MaxBodyBytes, MaxAudioBytes) does not stop many large uploads at once
// from filling memory. A request reserves its Content-Length before its
// body is read (a chunked body reserves as it is read); past the budget it
// waits up to Config.BodyBudgetWait for others to give bytes back, then is
// refused with 503. The bytes are given back when the handler ends: the
// pipeline keeps the body for retries until then.
type bodyBudget struct {
	max   int64
	wait  time.Duration
	gauge prometheus.Gauge

	mu      sync.Mutex
	used    int64
	freed   chan struct{} // closed (and replaced) when bytes are given back while someone waits
	waiting bool          // a request waits on freed
}

func newBodyBudget(max int64, wait time.Duration, gauge prometheus.Gauge) *bodyBudget {
	return &bodyBudget{max: max, wait: wait, gauge: gauge, freed: make(chan struct{})}
}

// errBodyBudget answers a request whose body did not fit in the budget.
func errBodyBudget(max int64) *apierr.Error {
	return &apierr.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "body_budget_exhausted",
		Message:    fmt.Sprintf("the gateway holds as many request bodies as it may (%d MiB in flight, --max-body-bytes-in-flight); try again shortly", max>>20),
		RetryAfter: time.Second}
}

// reserve takes n bytes of the budget, waiting up to the budget's wait for
// them; it fails with errBodyBudget, or ctx's error if the client went away.
func (b *bodyBudget) reserve(ctx context.Context, n int64) error {
	if n <= 0 {
		return nil
	}
	var timer *time.Timer
	for {
		b.mu.Lock()
		if b.used+n <= b.max {
			b.used += n
			b.gauge.Set(float64(b.used))
			b.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return nil
		}
		freed := b.freed
		b.waiting = true
		b.mu.Unlock()
		if n > b.max {
			return errBodyBudget(b.max) // would never fit
		}
		if timer == nil {
			timer = time.NewTimer(b.wait)
			defer timer.Stop()
		}
		select {
		case <-freed:
		case <-timer.C:
			return errBodyBudget(b.max)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// release gives n bytes back and wakes the requests waiting for them.
func (b *bodyBudget) release(n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	b.gauge.Set(float64(b.used))
	if b.waiting { // a new channel only when someone waits: none per request otherwise
		close(b.freed)
		b.freed, b.waiting = make(chan struct{}), false
	}
	b.mu.Unlock()
}

// budgetedBody is a request body of unknown length that reserves what it
// reads from the budget as it reads; held is what it has reserved, which
// is what it has read once a Read returns.
type budgetedBody struct {
	io.ReadCloser
	b    *bodyBudget
	ctx  context.Context
	held int64
}

// budgetStep bounds one Read of a budgetedBody, so what it reserves ahead
// of what arrived stays small.
const budgetStep = 64 << 10

func (r *budgetedBody) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	p = p[:min(len(p), budgetStep)]
	if err := r.b.reserve(r.ctx, int64(len(p))); err != nil {
		return 0, err
	}
	n, err := r.ReadCloser.Read(p)
	if n < len(p) {
		r.b.release(int64(len(p) - n))
	}
	r.held += int64(n)
	return n, err
}
