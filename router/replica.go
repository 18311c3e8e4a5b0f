package router

import (
	"context"
	"hash/fnv"
	"math"
	"net/url"
	"slices"
	"sync/atomic"
	"time"
)

// State is a replica's lifecycle state as seen by the gateway.
type State int32

const (
	StateStarting State = iota // registered, engine not up yet
	StateWarming               // engine up, warm-up running
	StateReady                 // may take traffic
	StateDraining              // finishing in-flight work, takes no new requests
	StateEjected               // taken out by the gateway after failures; probed back
	StateFailed                // the worker reports its engine failed
	StateLost                  // its lease ended: kept for operators to see, never routed to
	StateSleeping              // its engine sleeps (vLLM sleep mode): never routed to, woken on demand
)

var stateNames = [...]string{"starting", "warming", "ready", "draining", "ejected", "failed", "lost", "sleeping"}

// moves is the replica state machine: moves[from][to] says whether a replica
// may go from one state to another. A worker reports its own lifecycle by
// heartbeat, so every state it can report (starting, warming, ready,
// draining, failed, sleeping) is reachable from every other; only the gateway ejects,
// and only a replica that is taking traffic; only the lease sweep loses a
// replica, from any state, and the next heartbeat brings it back. Which writer may make which
// move beyond this (a heartbeat does not lift an ejection; a probe does) is
// the writer's rule, kept with it. Staying in a state is always allowed: it
// refreshes the reason.
var moves = [len(stateNames)][len(stateNames)]bool{
	StateStarting: {StateWarming: true, StateReady: true, StateDraining: true, StateFailed: true, StateLost: true, StateSleeping: true},
	StateWarming:  {StateStarting: true, StateReady: true, StateDraining: true, StateFailed: true, StateLost: true, StateSleeping: true},
	StateReady:    {StateStarting: true, StateWarming: true, StateDraining: true, StateEjected: true, StateFailed: true, StateLost: true, StateSleeping: true},
	StateDraining: {StateStarting: true, StateWarming: true, StateReady: true, StateFailed: true, StateLost: true, StateSleeping: true},
	StateEjected:  {StateStarting: true, StateWarming: true, StateReady: true, StateDraining: true, StateFailed: true, StateLost: true, StateSleeping: true},
	StateFailed:   {StateStarting: true, StateWarming: true, StateReady: true, StateDraining: true, StateLost: true, StateSleeping: true},
	StateLost:     {StateStarting: true, StateWarming: true, StateReady: true, StateDraining: true, StateFailed: true, StateSleeping: true},
	StateSleeping: {StateStarting: true, StateWarming: true, StateReady: true, StateDraining: true, StateFailed: true, StateLost: true},
}

// canMove reports whether moves allows from → to.
func canMove(from, to State) bool {
	if !from.valid() || !to.valid() {
		return false
	}
	return from == to || moves[from][to]
}

func (s State) valid() bool { return s >= 0 && int(s) < len(stateNames) }

func (s State) String() string {
	if s.valid() {
		return stateNames[s]
	}
	return "unknown"
}

// ParseState parses a state name; unknown names give StateFailed and false.
func ParseState(name string) (State, bool) {
	for i, n := range stateNames {
		if n == name {
			return State(i), true
		}
	}
	return StateFailed, false
}

// Replica is one upstream engine endpoint. Its counters are atomic so the hot
// path never takes a lock; its state, the reason for it and when it last
// became ready change together, in one step ([Replica.SetState] and the
// registry's own writers all go through one transition). Replica values
// must not be copied.
type Replica struct {
	// ID names the replica in metrics, headers and the ledger.
	ID string
	// URL is the base URL of the OpenAI-compatible server, without /v1.
	URL string
	// Static replicas come from configuration and are never dropped.
	Static bool
	// Worker is the id of the worker credential that registered the
	// replica; "" for static replicas. Set before the replica is added.
	Worker string

	status   atomic.Pointer[status]
	clock    atomic.Pointer[func() time.Time] // the registry's clock, once added to one
	onReady  atomic.Pointer[func()]           // the registry's hold release, once added to one
	inflight atomic.Int64
	lastUsed atomic.Int64              // unix nanos when the last attempt started on it
	classes  [numClasses]atomic.Int64  // inflight by Class
	base     atomic.Pointer[parsedURL] // URL parsed (BaseURL)
	models   atomic.Pointer[[]string]
	failures atomic.Int64           // consecutive failed attempts or probes
	lastOK   atomic.Int64           // unix nanos of the last good probe or heartbeat
	lease    atomic.Int64           // unix nanos when a registered replica's lease ends
	load     atomic.Pointer[Load]   // engine load from the last heartbeat
	engine   atomic.Pointer[string] // engine kind reported by the worker
	priority atomic.Bool            // the engine takes a request's priority (worker-reported)

	engineLog atomic.Pointer[[]string] // engine error lines from the last heartbeat

	lastLoss atomic.Pointer[Loss]   // why the replica last went away; nil: never
	probeErr atomic.Pointer[string] // why its last probe failed; nil after a good one

	idHash       uint64                   // for rendezvous hashing
	ttftBits     atomic.Uint64            // EWMA of time to first token, float64 nanoseconds
	backoffUntil atomic.Int64             // unix nanos: the replica pushed back (429/503 Retry-After)
	firstFailAt  atomic.Int64             // unix nanos of the first failure of the current streak
	ejection     atomic.Pointer[ejection] // ended at the replica's next ejection
	slots        atomic.Int64             // engine concurrency learnt from heartbeats (0: unknown)
	contextLen   atomic.Int64             // the engine's max_model_len from /v1/models (0: unknown)
	peakRunning  atomic.Int64             // the most sequences a heartbeat saw the engine running
}

// Slots returns the engine's concurrency as learnt from heartbeats (0: not
// known): the number of sequences it was running while requests waited for
// room in its batch (see [Replica.learnSlots]).
func (r *Replica) Slots() int64 { return r.slots.Load() }

// learnSlots learns the engine's concurrency from two consecutive
// heartbeats. A queue alone says little: vLLM holds requests back for more
// than full sequence slots (the step's token budget, KV blocks, a grammar
// still compiling), and a slot count learnt too low pauses hedging while the
// engine has room. So the running count is taken as the slot count only
// when requests wait for capacity, running did not fall since the last beat
// (no preemption), and it is near the most the engine was ever seen running
// (a wait far below that is a KV or token limit of the moment). A count the
// engine is later seen to exceed was wrong and is forgotten.
func (r *Replica) learnSlots(prev, now Load) {
	running := int64(now.Running)
	peak := r.peakRunning.Load()
	if running > peak {
		r.peakRunning.Store(running)
		peak = running
	}
	slots := r.slots.Load()
	switch {
	case running <= slots:
	case now.queued() > 0 && running >= int64(prev.Running) && 4*running >= 3*peak:
		r.slots.Store(running)
	case slots > 0:
		r.slots.Store(0)
	}
}

// full reports whether the gateway alone keeps every engine slot busy, a
// live sign of saturation between two heartbeats.
func (r *Replica) full() bool {
	s := r.slots.Load()
	return s > 0 && r.Inflight() >= s
}

// ejection is a context ended when the replica is next ejected.
type ejection struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newEjection() *ejection {
	ctx, cancel := context.WithCancel(context.Background())
	return &ejection{ctx: ctx, cancel: cancel}
}

// Ejected returns a channel closed when the replica is next ejected, so
// attempts still waiting for a first token there can give up and go
// elsewhere at once.
func (r *Replica) Ejected() <-chan struct{} { return r.ejection.Load().ctx.Done() }

// OnEjected calls f in a goroutine of its own when the replica is next
// ejected, unless stop is called first (stop reports whether it was in
// time). Unlike a goroutine waiting on Ejected, it costs nothing until then:
// every attempt arms one while it waits for its first token.
func (r *Replica) OnEjected(f func()) (stop func() bool) {
	return context.AfterFunc(r.ejection.Load().ctx, f)
}

// signalEjected wakes everyone waiting on Ejected or OnEjected.
func (r *Replica) signalEjected() {
	r.ejection.Swap(newEjection()).cancel()
}

// ttftAlpha weighs a new TTFT sample in the replica's moving average.
const ttftAlpha = 0.2

// ObserveTTFT folds one time-to-first-token sample into the replica's
// estimate.
func (r *Replica) ObserveTTFT(d time.Duration) {
	for {
		old := r.ttftBits.Load()
		prev := math.Float64frombits(old)
		next := float64(d)
		if prev > 0 {
			next = prev + ttftAlpha*(float64(d)-prev)
		}
		if r.ttftBits.CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// TTFTEstimate returns the replica's recent time to first token (0: no sample yet).
func (r *Replica) TTFTEstimate() time.Duration {
	return time.Duration(math.Float64frombits(r.ttftBits.Load()))
}

// BackOff keeps the replica out of selection until t (it answered 429 or 503
// with Retry-After).
func (r *Replica) BackOff(until time.Time) { r.backoffUntil.Store(until.UnixNano()) }

func (r *Replica) backingOff(now time.Time) bool { return now.UnixNano() < r.backoffUntil.Load() }

// Load is a replica's engine load as its worker last reported it.
type Load struct {
	Inflight int     // requests in the worker's sidecar
	Waiting  float64 // engine queue
	// WaitReasons says the engine split Waiting by reason: WaitingCapacity
	// wait for room in its batch (slots, token budget, KV blocks),
	// WaitingDeferred are held back for their own sake (a grammar
	// compiling, remote KV arriving).
	WaitReasons                      bool
	WaitingCapacity, WaitingDeferred float64
	Running                          float64 // sequences generating
	KVCacheUsage                     float64 // 0..1
	// Preemptions, PrefixCacheQueries and PrefixCacheHits are the engine's
	// counters since it started: running requests evicted for KV blocks,
	// prompt tokens looked up in its prefix cache and found there.
	Preemptions, PrefixCacheQueries, PrefixCacheHits float64
	// SleepState is the engine's sleep mode state (vLLM: awake,
	// weights_offloaded, discard_all); "" when it does not say.
	SleepState string
	TTFTMillis float64 // recent median engine time to first token; 0 = unknown
}

// queued returns the requests waiting for room in the engine's batch: all
// that wait, unless the engine said some wait for other reasons.
func (l Load) queued() float64 {
	if l.WaitReasons {
		return l.WaitingCapacity
	}
	return l.Waiting
}

// Load returns the last reported engine load (zero for static replicas).
func (r *Replica) Load() Load {
	if l := r.load.Load(); l != nil {
		return *l
	}
	return Load{}
}

// Engine returns the engine kind the worker reported ("" for static replicas).
func (r *Replica) Engine() string {
	if e := r.engine.Load(); e != nil {
		return *e
	}
	return ""
}

// PriorityScheduling reports whether the replica's engine runs with
// priority scheduling (vLLM --scheduling-policy priority), as its worker
// said: it takes a request body's priority field. false for static
// replicas and for engines with vLLM's default policy, which refuse a
// priority other than 0.
func (r *Replica) PriorityScheduling() bool { return r.priority.Load() }

// EngineLog returns the engine's last error lines as the worker's last
// heartbeat sent them (sent while the replica is not ready); nil when none.
func (r *Replica) EngineLog() []string {
	if l := r.engineLog.Load(); l != nil {
		return *l
	}
	return nil
}

// Loss is why a registered replica went away and when: its lease ended
// (the worker stopped sending heartbeats, with what the last probe said),
// or its worker came back from a restart at another address.
type Loss struct {
	Reason string
	At     time.Time
	// Was is the state the replica was in when it went away.
	Was State
}

// LastLoss returns why the replica last went away, or nil if it never did
// (a replica that came back keeps it, so an operator sees what happened).
func (r *Replica) LastLoss() *Loss {
	if l := r.lastLoss.Load(); l != nil {
		c := *l
		return &c
	}
	return nil
}

// ProbeError is why the replica's last probe failed; "" after a good one.
func (r *Replica) ProbeError() string {
	if e := r.probeErr.Load(); e != nil {
		return *e
	}
	return ""
}

// LeaseExpiry returns when a registered replica's lease ends (zero for static ones).
func (r *Replica) LeaseExpiry() time.Time {
	n := r.lease.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// NewReplica returns a replica in StateStarting serving no models yet.
func NewReplica(id, url string) *Replica {
	h := fnv.New64a()
	h.Write([]byte(id))
	r := &Replica{ID: id, URL: url, idHash: h.Sum64()}
	r.ejection.Store(newEjection())
	empty := []string{}
	r.models.Store(&empty)
	r.status.Store(&status{state: StateStarting, reason: "not probed yet"})
	return r
}

// BaseURL is URL parsed, once: the caller must not change it (an
// attempt's request copies it; parsing rep.URL plus a path per request was
// two allocations in BenchmarkGatewayOverhead's pprof, net/url.parse).
func (r *Replica) BaseURL() (*url.URL, error) {
	if b := r.base.Load(); b != nil && b.raw == r.URL {
		return b.u, b.err
	}
	u, err := url.Parse(r.URL)
	r.base.Store(&parsedURL{raw: r.URL, u: u, err: err})
	return u, err
}

// parsedURL is a Replica's URL parsed (BaseURL).
type parsedURL struct {
	raw string
	u   *url.URL
	err error
}

// status is what a transition changes, as one value.
type status struct {
	state      State
	reason     string // why the replica is out, "" when ready
	readySince int64  // unix nanos of the last move to ready (slow start); 0: never
}

// State returns the replica's state.
func (r *Replica) State() State { return r.status.Load().state }

// Inflight returns the number of requests the gateway has on the replica now.
func (r *Replica) Inflight() int64 { return r.inflight.Load() }

// InflightClass returns the gateway's attempts of class c on the replica now.
func (r *Replica) InflightClass(c Class) int64 { return r.classes[c.slot()].Load() }

// busyAbove reports whether the replica has attempts of a class higher than
// c in flight.
func (r *Replica) busyAbove(c Class) bool {
	for k := c + 1; k <= ClassInteractive; k++ {
		if r.classes[k.slot()].Load() > 0 {
			return true
		}
	}
	return false
}

// Models returns the models the replica serves.
func (r *Replica) Models() []string { return *r.models.Load() }

// Serves reports whether the replica serves model.
func (r *Replica) Serves(model string) bool { return slices.Contains(*r.models.Load(), model) }

// Reason says why the replica is not ready ("" when it is).
func (r *Replica) Reason() string { return r.status.Load().reason }

// readySince returns when the replica last became ready (0: never), in unix
// nanoseconds of its registry's clock.
func (r *Replica) readySince() int64 { return r.status.Load().readySince }

// LastOK returns the time of the last successful probe or heartbeat.
func (r *Replica) LastOK() time.Time {
	n := r.lastOK.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// ContextLen is the engine's context length (vLLM's max_model_len: prompt
// and completion together) as its /v1/models says; 0 when unknown.
func (r *Replica) ContextLen() int64 { return r.contextLen.Load() }

// SetContextLen records the engine's context length (0: unknown).
func (r *Replica) SetContextLen(n int64) { r.contextLen.Store(max(n, 0)) }

// SetModels replaces the models the replica serves.
func (r *Replica) SetModels(models []string) {
	m := slices.Clone(models)
	r.models.Store(&m)
}

// SetState moves the replica to lifecycle state s from whatever state it is
// in, recording why (reason is "" for ready), and reports whether it did.
// It does not eject: that is [Registry.Eject]'s, which also wakes the
// attempts waiting there and counts it; nor lose: that is the lease sweep's
// ([Registry.ExpireLeases]). A move to ready starts slow start,
// timed by the registry's clock (the wall clock before the replica is added
// to a registry).
func (r *Replica) SetState(s State, reason string) bool {
	if s == StateEjected || s == StateLost {
		return false
	}
	now := r.now()
	for {
		cur := r.State()
		if !canMove(cur, s) {
			return false
		}
		if r.transition(cur, s, reason, now) {
			return true
		}
		// Another writer moved the replica meanwhile: decide again.
	}
}

// transition moves the replica from state from to state to, recording
// reason, when it is still in from and moves allows the move; it reports
// whether it did. Every state change goes through here. A caller names the
// state it saw so that its decision cannot land on a state another writer
// set meanwhile (a heartbeat must not lift an ejection that happened since
// it looked). A move to ready records now as the start of slow start;
// staying in a state only refreshes the reason.
func (r *Replica) transition(from, to State, reason string, now time.Time) bool {
	if !canMove(from, to) {
		return false
	}
	for {
		old := r.status.Load()
		if old.state != from {
			return false
		}
		next := &status{state: to, reason: reason, readySince: old.readySince}
		if to == StateReady && from != StateReady {
			next.readySince = now.UnixNano()
		}
		if r.status.CompareAndSwap(old, next) {
			if to == StateReady && from != StateReady {
				if f := r.onReady.Load(); f != nil {
					(*f)()
				}
			}
			return true
		}
		// Another writer got there first: look again.
	}
}

// now reads the clock of the registry the replica belongs to.
func (r *Replica) now() time.Time {
	if c := r.clock.Load(); c != nil {
		return (*c)()
	}
	return time.Now()
}

// markOK records a successful probe or attempt.
func (r *Replica) markOK(now time.Time) {
	if r.failures.Load() != 0 {
		r.failures.Store(0)
	}
	r.firstFailAt.Store(0)
	r.lastOK.Store(now.UnixNano())
}

// markFailure counts a failure and remembers when the streak began.
func (r *Replica) markFailure(now time.Time) {
	if r.failures.Add(1) == 1 {
		r.firstFailAt.CompareAndSwap(0, now.UnixNano())
	}
}

// acquire counts one attempt of class c in flight in s; s.release gives
// it back and is safe to call more than once.
func (r *Replica) acquire(c Class, s *inflightSlot) {
	r.inflight.Add(1)
	r.lastUsed.Store(r.now().UnixNano())
	s.rep, s.cls = r, &r.classes[c.slot()]
	s.cls.Add(1)
}

// inflightSlot is one attempt's count in its replica's in-flight figures
// (see acquire). A struct, not a closure over the counters: an attempt
// holds its own (BenchmarkGatewayOverhead's pprof: acquire's
// closure and its done flag, 1.3 allocations a request).
type inflightSlot struct {
	rep  *Replica
	cls  *atomic.Int64
	done atomic.Bool
}

// release gives the slot back; only the first call counts.
func (s *inflightSlot) release() {
	if s.done.CompareAndSwap(false, true) {
		s.cls.Add(-1)
		s.rep.inflight.Add(-1)
	}
}
