package sim

import (
	"container/list"
	"context"
	"math"
	"sync"
	"time"
)

// scheduler admits requests to generation: each takes one of max slots and,
// when the engine has a KV cache of kvCap tokens, the tokens it needs in it.
// Requests that do not fit wait in FIFO order; like vLLM's FCFS scheduler,
// a head that does not fit blocks the ones behind it, so requests can wait
// while slots are free. Released room passes straight to the first
// waiters, so a newcomer can never overtake the queue.
//
// With priority scheduling (vllm serve --scheduling-policy priority) the
// waiting queue is ordered by (priority, arrival) instead, a lower
// priority value first, as vLLM's PriorityRequestQueue orders it
// (vllm/v1/core/sched/request_queue.py): a request of a lower value
// overtakes the waiting requests of higher values, never a running one.
// (vLLM also preempts a running request of a higher value when KV blocks
// run out; the simulator does not.)
type scheduler struct {
	max      int
	kvCap    int                            // 0: no KV limit
	priority bool                           // order the queue by (priority, arrival)
	publish  func(running, waiting, kv int) // called under mu on every change

	mu      sync.Mutex
	running int
	kvUsed  int
	queue   list.List // of *waiter, oldest first
}

type waiter struct {
	tokens   int
	priority int64         // with priority scheduling: lower goes first
	ready    chan struct{} // closed when the slot is handed over
	granted  bool          // guarded by scheduler.mu
}

func newScheduler(max, kvCap int, priority bool, publish func(running, waiting, kv int)) *scheduler {
	s := &scheduler{max: max, kvCap: kvCap, priority: priority, publish: publish}
	publish(0, 0, 0)
	return s
}

// need returns what a request of tokens takes in the KV cache: never more
// than the whole cache, so an oversized request runs alone rather than
// never.
func (s *scheduler) need(tokens int) int {
	if s.kvCap == 0 {
		return 0
	}
	return min(tokens, s.kvCap)
}

// fits reports whether a request taking kv more tokens can start now.
func (s *scheduler) fits(kv int) bool {
	return s.running < s.max && (s.kvCap == 0 || s.kvUsed+kv <= s.kvCap)
}

// acquire blocks until the caller holds a slot and room for tokens in the
// KV cache, or ctx ends. On success the caller must call release(tokens)
// exactly once.
// priority is the request's priority field; without priority scheduling
// it is ignored (the request was refused unless it is 0).
func (s *scheduler) acquire(ctx context.Context, tokens int, priority int64) error {
	kv := s.need(tokens)
	s.mu.Lock()
	if s.queue.Len() == 0 && s.fits(kv) {
		s.running++
		s.kvUsed += kv
		s.publish(s.running, s.queue.Len(), s.kvUsed)
		s.mu.Unlock()
		return nil
	}
	w := &waiter{tokens: kv, priority: priority, ready: make(chan struct{})}
	el := s.enqueue(w)
	if s.priority && el == s.queue.Front() {
		s.admit() // it may fit where the head it overtook did not
	}
	s.publish(s.running, s.queue.Len(), s.kvUsed)
	s.mu.Unlock()

	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	if w.granted {
		// The room arrived together with the cancellation: pass it on.
		s.mu.Unlock()
		s.release(tokens)
		return ctx.Err()
	}
	s.queue.Remove(el)
	s.admit() // the head may have been what blocked the others
	s.publish(s.running, s.queue.Len(), s.kvUsed)
	s.mu.Unlock()
	return ctx.Err()
}

// enqueue puts w in the waiting queue: last, or with priority scheduling
// behind every waiter of the same or a lower priority value (those arrived
// earlier). Called under mu.
func (s *scheduler) enqueue(w *waiter) *list.Element {
	if !s.priority {
		return s.queue.PushBack(w)
	}
	for el := s.queue.Back(); el != nil; el = el.Prev() {
		if el.Value.(*waiter).priority <= w.priority {
			return s.queue.InsertAfter(w, el)
		}
	}
	return s.queue.PushFront(w)
}

// release gives back a slot and the KV room of a request of tokens,
// handing them to the first waiters that fit.
func (s *scheduler) release(tokens int) {
	s.mu.Lock()
	s.running--
	s.kvUsed -= s.need(tokens)
	s.admit()
	s.publish(s.running, s.queue.Len(), s.kvUsed)
	s.mu.Unlock()
}

// admit starts waiters from the front while they fit. Called under mu.
func (s *scheduler) admit() {
	for front := s.queue.Front(); front != nil; front = s.queue.Front() {
		w := front.Value.(*waiter)
		if !s.fits(w.tokens) {
			return
		}
		s.queue.Remove(front)
		s.running++
		s.kvUsed += w.tokens
		w.granted = true
		close(w.ready)
	}
}

// load returns the number of running and waiting requests.
func (s *scheduler) load() (running, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running, s.queue.Len()
}

// TPSpeedup is how much faster a model split over tp GPUs (tensor
// parallelism) prefills and decodes than on one: tp less what the
// all-reduces between the GPUs cost, taken here as 10 % a doubling
// (2 GPUs 1.8×, 4 GPUs 3.24×, 8 GPUs 5.83×). It is a modelling
// assumption, not a measurement: on real GPUs it depends on the model's
// size and the interconnect (NVLink or PCIe), which is why `tailgate tune`
// measures it rather than trusting it.
func TPSpeedup(tp int) float64 {
	if tp <= 1 {
		return 1
	}
	return float64(tp) * math.Pow(0.9, math.Log2(float64(tp)))
}

// prefillLane times the prefill of scheduled prompts. Without a per-step
// token budget each prompt takes perToken a token, in parallel with the
// others (the simulator's default). With one (--max-num-batched-tokens) it
// follows vLLM v1's scheduler (vllm/v1/core/sched/scheduler.py,
// Scheduler.schedule): every step starts from token_budget =
// max_num_scheduled_tokens, the RUNNING requests are served first (a
// decoding request takes one token of it), and then the WAITING requests,
// first come first served, each getting num_new_tokens = min(its
// remaining prompt, token_budget) — a prompt longer than what is left is
// prefilled in chunks over several steps. Here the prompts form one FIFO
// lane: a prompt's chunks start when the prompts scheduled before it are
// done, a step carries at most budget less the running decodes of its
// prompt tokens and lasts the longer of TPOT (one forward pass) and its
// tokens' prefill time. The simplification: a step whose chunk ends a
// prompt does not also carry the next prompt's first chunk.
type prefillLane struct {
	perToken time.Duration // one prompt token's prefill, TP speed-up applied
	step     time.Duration // the shortest step: TPOT, TP speed-up applied
	budget   int           // 0: no budget, prefills run in parallel

	mu   sync.Mutex
	free time.Time // when the prompts scheduled so far are prefilled
}

func newPrefillLane(cfg Config) *prefillLane {
	s := TPSpeedup(cfg.TensorParallelSize)
	return &prefillLane{
		perToken: time.Duration(float64(cfg.PrefillPerToken) / s),
		step:     time.Duration(float64(cfg.TPOT) / s),
		budget:   cfg.MaxNumBatchedTokens,
	}
}

// take schedules the prefill of tokens prompt tokens at now, beside
// decoding running requests, and returns how long until they are
// prefilled.
func (l *prefillLane) take(tokens, decoding int, now time.Time) time.Duration {
	if l.budget == 0 {
		return scale(l.perToken, tokens)
	}
	per := max(l.budget-max(decoding, 0), 1) // vLLM: decodes take their token first
	stepOf := func(n int) time.Duration { return max(l.step, scale(l.perToken, n)) }
	work := scale(stepOf(per), tokens/per)
	if r := tokens % per; r > 0 || tokens == 0 {
		work += stepOf(r)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	start := now
	if l.free.After(now) {
		start = l.free
	}
	l.free = start.Add(work)
	return l.free.Sub(now)
}
