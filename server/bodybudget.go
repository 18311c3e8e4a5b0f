package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tailgate-dev/tailgate/server/apierr"
)

// bodyBudget bounds the request-body bytes the gateway holds at once
// (Config.MaxBodyBytesInFlight), over all requests and per tenant
// (Config.MaxBodyBytesPerTenant): each request's own bound (MaxBodyBytes,
// MaxAudioBytes) does not stop many large uploads at once from filling
// memory, and the share keeps one tenant's uploads — slow ones included —
// from taking the bytes every other tenant needs. Every copy the gateway
// makes of a body counts: the body as read, and the body as forwarded when
// reading it made a new one (a re-encoded multipart form, a JSON body with
// fields added).
//
// A request reserves its Content-Length before its body is read (a chunked
// body reserves as it is read); past the total or its tenant's share it
// waits up to Config.BodyBudgetWait for bytes to be given back, then is
// refused: 503 when the gateway is full, 429 when its tenant holds its
// share. Bytes given back go to the waiters tenant by tenant in turn (each
// tenant's own waiters in arrival order), so a tenant at its share never
// stands before another's request. The bytes are given back when the
// handler ends: the pipeline keeps the body for retries until then.
type bodyBudget struct {
	max   int64
	share int64 // per tenant
	wait  time.Duration
	gauge prometheus.Gauge

	mu     sync.Mutex
	used   int64
	owners map[int64]*bodyOwner // tenants holding bytes or waiting for them
	ring   []int64              // tenants with waiters, served in turn
	next   int                  // index in ring of the tenant served next
}

// bodyOwner is one tenant's bytes held and requests waiting.
type bodyOwner struct {
	held    int64
	waiters []*bodyWaiter
}

type bodyWaiter struct {
	n       int64
	ready   chan struct{}
	granted bool // guarded by the budget's mu
}

func newBodyBudget(max, share int64, wait time.Duration, gauge prometheus.Gauge) *bodyBudget {
	return &bodyBudget{max: max, share: min(share, max), wait: wait, gauge: gauge, owners: map[int64]*bodyOwner{}}
}

// errBodyBudget answers a request whose body did not fit in the budget.
func errBodyBudget(max int64) *apierr.Error {
	return &apierr.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "body_budget_exhausted",
		Message:    fmt.Sprintf("the gateway holds as many request bodies as it may (%d MiB in flight, --max-body-bytes-in-flight); try again shortly", max>>20),
		RetryAfter: time.Second}
}

// errBodyShare answers a request whose body did not fit in its tenant's
// share of the budget: the tenant's own requests hold it.
func errBodyShare(share int64) *apierr.Error {
	return &apierr.Error{Status: http.StatusTooManyRequests, Type: "requests", Code: "body_share_exhausted",
		Message:    fmt.Sprintf("this tenant's requests in flight hold its share of request-body bytes (%d MiB, --max-body-bytes-per-tenant); try again when one ends", share>>20),
		RetryAfter: time.Second}
}

// fits reports whether o may take n more bytes now; b.mu held.
func (b *bodyBudget) fits(o *bodyOwner, n int64) bool {
	return b.used+n <= b.max && o.held+n <= b.share
}

func (b *bodyBudget) owner(tenant int64) *bodyOwner {
	o := b.owners[tenant]
	if o == nil {
		o = &bodyOwner{}
		b.owners[tenant] = o
	}
	return o
}

// take books n bytes to o; b.mu held.
func (b *bodyBudget) take(o *bodyOwner, n int64) {
	b.used += n
	o.held += n
	b.gauge.Set(float64(b.used))
}

// reserve takes n bytes of the budget for tenant, waiting up to the
// budget's wait for them; it fails with errBodyBudget or errBodyShare, or
// ctx's error if the client went away.
func (b *bodyBudget) reserve(ctx context.Context, tenant, n int64) error {
	if n <= 0 {
		return nil
	}
	if n > b.share {
		return errBodyShare(b.share) // would never fit
	}
	b.mu.Lock()
	o := b.owner(tenant)
	if len(o.waiters) == 0 && b.fits(o, n) {
		b.take(o, n)
		b.mu.Unlock()
		return nil
	}
	w := &bodyWaiter{n: n, ready: make(chan struct{})}
	if len(o.waiters) == 0 {
		b.ring = append(b.ring, tenant)
	}
	o.waiters = append(o.waiters, w)
	b.mu.Unlock()

	timer := time.NewTimer(b.wait)
	defer timer.Stop()
	var err error
	select {
	case <-w.ready:
		return nil
	case <-timer.C:
	case <-ctx.Done():
		err = ctx.Err()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.granted {
		if err == nil {
			return nil // granted as the wait ran out: take it
		}
		b.giveBack(tenant, o, n)
		return err
	}
	b.leave(tenant, o, w)
	if err != nil {
		return err
	}
	if o.held+n > b.share {
		return errBodyShare(b.share)
	}
	return errBodyBudget(b.max)
}

// force books n bytes to tenant whether they fit or not.
func (b *bodyBudget) force(tenant, n int64) {
	b.mu.Lock()
	b.take(b.owner(tenant), n)
	b.mu.Unlock()
}

// leave takes a waiter that gave up out of its tenant's queue; b.mu held.
func (b *bodyBudget) leave(tenant int64, o *bodyOwner, w *bodyWaiter) {
	i := slices.Index(o.waiters, w)
	if i < 0 {
		return
	}
	o.waiters = slices.Delete(o.waiters, i, i+1)
	if len(o.waiters) == 0 {
		b.dropFromRing(tenant)
		if o.held == 0 {
			delete(b.owners, tenant)
		}
	}
	// The head of its tenant's queue may have kept smaller requests
	// behind it that fit now.
	b.dispatch()
}

func (b *bodyBudget) dropFromRing(tenant int64) {
	j := slices.Index(b.ring, tenant)
	if j < 0 {
		return
	}
	b.ring = slices.Delete(b.ring, j, j+1)
	if j < b.next {
		b.next--
	}
	if b.next >= len(b.ring) {
		b.next = 0
	}
}

// release gives n of tenant's bytes back and hands them to the waiters.
func (b *bodyBudget) release(tenant, n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	o := b.owners[tenant]
	if o == nil {
		return
	}
	b.giveBack(tenant, o, n)
}

// giveBack returns n bytes of o's; b.mu held.
func (b *bodyBudget) giveBack(tenant int64, o *bodyOwner, n int64) {
	b.used -= n
	o.held -= n
	b.gauge.Set(float64(b.used))
	if o.held <= 0 && len(o.waiters) == 0 {
		delete(b.owners, tenant)
	}
	b.dispatch()
}

// dispatch grants waiting requests what fits, one tenant's oldest waiter
// at a time in turn, until a whole turn grants nothing; b.mu held.
func (b *bodyBudget) dispatch() {
	for granted := true; granted && len(b.ring) > 0; {
		granted = false
		for range len(b.ring) {
			if b.next >= len(b.ring) {
				b.next = 0
			}
			tenant := b.ring[b.next]
			o := b.owners[tenant]
			w := o.waiters[0]
			if !b.fits(o, w.n) {
				b.next++
				continue
			}
			b.take(o, w.n)
			w.granted = true
			close(w.ready)
			o.waiters[0] = nil
			o.waiters = o.waiters[1:]
			granted = true
			if len(o.waiters) == 0 {
				b.dropFromRing(tenant) // next now points at the tenant after it
				if len(b.ring) == 0 {
					break
				}
				continue
			}
			b.next++
		}
	}
}

// budgetedBody is a request body of unknown length that reserves what it
// reads from its tenant's budget as it reads; held is what it has
// reserved, which is what it has read once a Read returns.
type budgetedBody struct {
	io.ReadCloser
	b      *bodyBudget
	ctx    context.Context
	tenant int64
	held   int64
}

// budgetStep bounds one Read of a budgetedBody, so what it reserves ahead
// of what arrived stays small.
const budgetStep = 64 << 10

func (r *budgetedBody) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	p = p[:min(len(p), budgetStep)]
	if err := r.b.reserve(r.ctx, r.tenant, int64(len(p))); err != nil {
		return 0, err
	}
	n, err := r.ReadCloser.Read(p)
	if n < len(p) {
		r.b.release(r.tenant, int64(len(p)-n))
	}
	r.held += int64(n)
	return n, err
}

// reserveCopy books the body a parsed request forwards when reading it
// made a copy of what the client sent (a re-encoded form, a JSON body with
// fields added): that copy is held until the request ends too. Only a call
// whose body was read under the budget (the public API's) counts; what it
// reserved for the copy ahead (cl.copyAhead) is set against it.
func (s *Server) reserveCopy(ctx context.Context, cl *call, body []byte, pr *parsedRequest) error {
	if !cl.budgeted {
		return nil
	}
	var want int64
	if len(pr.body) > 0 && (len(body) == 0 || unsafe.SliceData(pr.body) != unsafe.SliceData(body)) {
		want = int64(len(pr.body))
	}
	tenant := cl.principal.TenantID
	switch d := want - cl.copyAhead; {
	case d > 0 && cl.copyAhead > 0:
		// The copy was reserved ahead and came out a little longer (a
		// form's new boundary): booked, not waited for, so two requests
		// that filled the budget between them cannot stop each other.
		s.bodies.force(tenant, d)
		cl.bodyHeld += d
	case d > 0:
		if err := s.bodies.reserve(ctx, tenant, d); err != nil {
			return err
		}
		cl.bodyHeld += d
	case d < 0:
		s.bodies.release(tenant, -d)
		cl.bodyHeld += d
	}
	cl.copyAhead = want
	return nil
}
