package policy

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// QueueConfig configures an [AdmissionQueue]. The zero value is usable: it
// never makes a request wait.
type QueueConfig struct {
	// Capacity estimates how many generation requests of a model its ready
	// replicas can run at once (their engines' slots); 0 means unknown, and
	// then nothing waits. Nil means always unknown.
	Capacity func(model string) int64
	// Headroom is how far above the capacity interactive requests are
	// still admitted at once, and how far below it batch requests stop (at
	// least one runs), so a batch never takes the slots an interactive
	// request needs next. 0 means an eighth of the capacity, rounded up;
	// negative means none.
	Headroom int64
	// MaxQueue bounds the requests waiting per class and model; past it a
	// request is refused with a [QueueError] (Full). 0 means 256.
	MaxQueue int
	// MaxQueuePerTenant bounds one tenant's share of each MaxQueue; past
	// it the tenant's request is refused with a [QueueError] (Full) while
	// other tenants still queue. 0 means a quarter of MaxQueue, at least
	// 1: a tenant's burst takes at most a quarter of the places, and
	// waiters are served tenant by tenant, so another tenant's request is
	// never behind more than one of its waiters.
	MaxQueuePerTenant int
	// MaxWait bounds how long a request waits for its turn; past it, it is
	// refused with a [QueueError]. 0 means 30s.
	MaxWait time.Duration
}

// Defaults for the zero QueueConfig.
const (
	DefaultMaxQueue = 256
	DefaultMaxWait  = 30 * time.Second
)

// QueueError refuses a request that could not wait for its turn: the queue
// of its class was full (Full), or its wait ran out.
type QueueError struct {
	Class Class
	Full  bool
	// Wait is how long the request waited (its MaxWait, when it timed out).
	Wait time.Duration
}

func (e *QueueError) Error() string {
	if e.Full {
		return "admission queue full: " + e.Class.String()
	}
	return "admission queue wait ran out: " + e.Class.String()
}

// AdmissionQueue holds generation requests back while their model's
// replicas are busy, so that a burst of lower-class work cannot take the
// capacity interactive requests need.
//
// A model is busy when the requests it admitted and that have not ended
// reach its limit for the request's class: the capacity plus the headroom
// for interactive, the capacity for standard, the capacity less the
// headroom for batch. A request that finds its limit reached, or others of
// its class (or a higher one) waiting, waits in its class's FIFO queue;
// within a class, tenants take turns, so one tenant's burst does not starve
// another's single request. As admitted requests end, waiters are admitted
// in class order. An admitted request is never preempted.
//
// The waiting happens before any upstream attempt and holds no replica
// slot; a waiter whose client goes away leaves the queue at once.
type AdmissionQueue struct {
	cfg     QueueConfig
	models  sync.Map // model name → *modelQueue
	waiting [numClasses]atomic.Int64
}

// NewQueue returns an admission queue.
func NewQueue(cfg QueueConfig) *AdmissionQueue {
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = DefaultMaxQueue
	}
	if cfg.MaxQueuePerTenant <= 0 {
		cfg.MaxQueuePerTenant = max(cfg.MaxQueue/4, 1)
	}
	cfg.MaxQueuePerTenant = min(cfg.MaxQueuePerTenant, cfg.MaxQueue)
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	return &AdmissionQueue{cfg: cfg}
}

// Waiting returns how many requests of class c wait, over every model.
func (q *AdmissionQueue) Waiting(c Class) int64 { return q.waiting[c.rank()].Load() }

// Slot is an admitted request's place in its model's capacity. Release it
// exactly once when the request ends; later calls do nothing.
type Slot struct {
	mq       *modelQueue
	released atomic.Bool
	// Waited is how long the request waited in the queue (0: admitted at once).
	Waited time.Duration
}

// Release frees the slot, admitting waiters in class order. A nil Slot
// releases nothing.
func (s *Slot) Release() {
	if s == nil || !s.released.CompareAndSwap(false, true) {
		return
	}
	s.mq.release()
}

// Wait admits a request of class c for model, of the given tenant, at once
// or after a wait. It returns a *QueueError when the class's queue is full
// or the wait runs out, and ctx's error when ctx ends first; either way
// the request took nothing.
func (q *AdmissionQueue) Wait(ctx context.Context, model string, c Class, tenant int64) (*Slot, error) {
	mq := q.model(model)
	limits := mq.limits()
	r := c.rank()

	mq.mu.Lock()
	if mq.admissible(r, limits) {
		mq.inflight++
		mq.mu.Unlock()
		return &Slot{mq: mq}, nil
	}
	cq := &mq.classes[r]
	if cq.n >= q.cfg.MaxQueue || len(cq.tenants[tenant]) >= q.cfg.MaxQueuePerTenant {
		mq.mu.Unlock()
		return nil, &QueueError{Class: c, Full: true}
	}
	w := &waiter{ready: make(chan struct{}), tenant: tenant}
	cq.push(w)
	q.waiting[r].Add(1)
	mq.mu.Unlock()

	start := time.Now()
	timer := time.NewTimer(q.cfg.MaxWait)
	defer timer.Stop()
	var err error
	select {
	case <-w.ready:
		return &Slot{mq: mq, Waited: time.Since(start)}, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
		err = &QueueError{Class: c, Wait: q.cfg.MaxWait}
	}
	mq.mu.Lock()
	switch {
	case !w.admitted:
		cq.remove(w)
		q.waiting[r].Add(-1)
	case ctx.Err() == nil:
		// Admitted as the wait ran out: take the turn.
		mq.mu.Unlock()
		return &Slot{mq: mq, Waited: time.Since(start)}, nil
	default:
		// Admitted as the client left: hand the turn on.
		mq.inflight--
		mq.dispatch(mq.limits())
	}
	mq.mu.Unlock()
	return nil, err
}

func (q *AdmissionQueue) model(name string) *modelQueue {
	if v, ok := q.models.Load(name); ok {
		return v.(*modelQueue)
	}
	v, _ := q.models.LoadOrStore(name, &modelQueue{q: q, name: name})
	return v.(*modelQueue)
}

// modelQueue is one model's admitted count and waiters.
type modelQueue struct {
	q    *AdmissionQueue
	name string

	mu       sync.Mutex
	inflight int64
	classes  [numClasses]classQueue // by rank
}

// limits returns the model's in-flight limit per class rank; nil means the
// capacity is unknown and nothing waits.
func (mq *modelQueue) limits() *[numClasses]int64 {
	if mq.q.cfg.Capacity == nil {
		return nil
	}
	capacity := mq.q.cfg.Capacity(mq.name)
	if capacity <= 0 {
		return nil
	}
	head := mq.q.cfg.Headroom
	switch {
	case head == 0:
		head = (capacity + 7) / 8
	case head < 0:
		head = 0
	}
	return &[numClasses]int64{capacity + head, capacity, max(capacity-head, 1)}
}

// admissible reports whether a request of rank r may be admitted now: no
// one of its rank or above waits, and its limit is not reached. Callers hold
// mu.
func (mq *modelQueue) admissible(r int, limits *[numClasses]int64) bool {
	for i := 0; i <= r; i++ {
		if mq.classes[i].n > 0 {
			return false
		}
	}
	return limits == nil || mq.inflight < limits[r]
}

func (mq *modelQueue) release() {
	limits := mq.limits()
	mq.mu.Lock()
	mq.inflight--
	mq.dispatch(limits)
	mq.mu.Unlock()
}

// dispatch admits waiters in class order while their limits allow. The
// limits fall with the class, so a class that must wait stops every class
// below it too. Callers hold mu.
func (mq *modelQueue) dispatch(limits *[numClasses]int64) {
	for r := range mq.classes {
		cq := &mq.classes[r]
		for cq.n > 0 && (limits == nil || mq.inflight < limits[r]) {
			w := cq.pop()
			w.admitted = true
			mq.inflight++
			mq.q.waiting[r].Add(-1)
			close(w.ready)
		}
	}
}

type waiter struct {
	ready    chan struct{}
	tenant   int64
	admitted bool // guarded by the modelQueue's mu
}

// classQueue is one class's waiters: a FIFO per tenant, served round robin
// over the tenants in the order they started waiting.
type classQueue struct {
	n       int
	tenants map[int64][]*waiter
	ring    []int64 // tenants with waiters
	next    int     // index in ring of the tenant served next
}

func (cq *classQueue) push(w *waiter) {
	if cq.tenants == nil {
		cq.tenants = make(map[int64][]*waiter)
	}
	ws := cq.tenants[w.tenant]
	if len(ws) == 0 {
		cq.ring = append(cq.ring, w.tenant)
	}
	cq.tenants[w.tenant] = append(ws, w)
	cq.n++
}

// pop takes the next tenant's oldest waiter; the queue must not be empty.
func (cq *classQueue) pop() *waiter {
	t := cq.ring[cq.next]
	ws := cq.tenants[t]
	w := ws[0]
	ws[0] = nil
	cq.n--
	if len(ws) == 1 {
		delete(cq.tenants, t)
		cq.ring = slices.Delete(cq.ring, cq.next, cq.next+1)
	} else {
		cq.tenants[t] = ws[1:]
		cq.next++
	}
	if cq.next >= len(cq.ring) {
		cq.next = 0
	}
	return w
}

// remove takes w out of the queue (it stopped waiting).
func (cq *classQueue) remove(w *waiter) {
	ws := cq.tenants[w.tenant]
	i := slices.Index(ws, w)
	if i < 0 {
		return
	}
	cq.n--
	if len(ws) > 1 {
		cq.tenants[w.tenant] = slices.Delete(ws, i, i+1)
		return
	}
	delete(cq.tenants, w.tenant)
	j := slices.Index(cq.ring, w.tenant)
	cq.ring = slices.Delete(cq.ring, j, j+1)
	if j < cq.next {
		cq.next--
	}
	if cq.next >= len(cq.ring) {
		cq.next = 0
	}
}
