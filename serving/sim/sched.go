package sim

import (
	"container/list"
	"context"
	"sync"
)

// scheduler admits requests to generation: each takes one of max slots and,
// when the engine has a KV cache of kvCap tokens, the tokens it needs in it.
// Requests that do not fit wait in FIFO order; like vLLM's FCFS scheduler,
// a head that does not fit blocks the ones behind it, so requests can wait
// while slots are free. Released room passes straight to the oldest
// waiters, so a newcomer can never overtake the queue.
type scheduler struct {
	max     int
	kvCap   int                            // 0: no KV limit
	publish func(running, waiting, kv int) // called under mu on every change

	mu      sync.Mutex
	running int
	kvUsed  int
	queue   list.List // of *waiter, oldest first
}

type waiter struct {
	tokens  int
	ready   chan struct{} // closed when the slot is handed over
	granted bool          // guarded by scheduler.mu
}

func newScheduler(max, kvCap int, publish func(running, waiting, kv int)) *scheduler {
	s := &scheduler{max: max, kvCap: kvCap, publish: publish}
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
func (s *scheduler) acquire(ctx context.Context, tokens int) error {
	kv := s.need(tokens)
	s.mu.Lock()
	if s.queue.Len() == 0 && s.fits(kv) {
		s.running++
		s.kvUsed += kv
		s.publish(s.running, s.queue.Len(), s.kvUsed)
		s.mu.Unlock()
		return nil
	}
	w := &waiter{tokens: kv, ready: make(chan struct{})}
	el := s.queue.PushBack(w)
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

// release gives back a slot and the KV room of a request of tokens,
// handing them to the oldest waiters that fit.
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
