package sim

import (
	"container/list"
	"context"
	"sync"
)

// scheduler hands out a fixed number of generation slots; requests beyond
// them wait in FIFO order. A released slot passes straight to the oldest
// waiter, so a newcomer can never overtake the queue.
type scheduler struct {
	max     int
	publish func(running, waiting int) // called under mu on every change

	mu      sync.Mutex
	running int
	queue   list.List // of *waiter, oldest first
}

type waiter struct {
	ready   chan struct{} // closed when the slot is handed over
	granted bool          // guarded by scheduler.mu
}

func newScheduler(max int, publish func(running, waiting int)) *scheduler {
	s := &scheduler{max: max, publish: publish}
	publish(0, 0)
	return s
}

// acquire blocks until the caller holds a slot or ctx ends. On success the
// caller must call release exactly once.
func (s *scheduler) acquire(ctx context.Context) error {
	s.mu.Lock()
	if s.running < s.max && s.queue.Len() == 0 {
		s.running++
		s.publish(s.running, s.queue.Len())
		s.mu.Unlock()
		return nil
	}
	w := &waiter{ready: make(chan struct{})}
	el := s.queue.PushBack(w)
	s.publish(s.running, s.queue.Len())
	s.mu.Unlock()

	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	if w.granted {
		// The slot arrived together with the cancellation: pass it on.
		s.mu.Unlock()
		s.release()
		return ctx.Err()
	}
	s.queue.Remove(el)
	s.publish(s.running, s.queue.Len())
	s.mu.Unlock()
	return ctx.Err()
}

// release gives a slot back, handing it to the oldest waiter if any.
func (s *scheduler) release() {
	s.mu.Lock()
	if front := s.queue.Front(); front != nil {
		w := s.queue.Remove(front).(*waiter)
		w.granted = true
		close(w.ready)
	} else {
		s.running--
	}
	s.publish(s.running, s.queue.Len())
	s.mu.Unlock()
}

// load returns the number of running and waiting requests.
func (s *scheduler) load() (running, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running, s.queue.Len()
}
