package fleet

import (
	"slices"
	"sync"
	"time"

	"github.com/tailgate-dev/tailgate/router"
)

// Action is one provider action the controller took, as the admin API and
// the dashboard show it.
type Action struct {
	Time    time.Time `json:"time"`
	Model   string    `json:"model"`
	Kind    string    `json:"kind"` // start, stop, replace (a lost or drained replica), preempted
	Replica string    `json:"replica"`
	// Reason says why: for a start what it answers (min, waiting,
	// inflight, lost, preempted, drained), for a stop idle or shutdown,
	// for preempted the worker's notice.
	Reason     string  `json:"reason,omitempty"`
	Outcome    string  `json:"outcome"` // ok, error
	Error      string  `json:"error,omitempty"`
	DurationMS float64 `json:"duration_ms"`

	Duration time.Duration `json:"-"`
}

// ModelStatus is one managed model as the controller sees it.
type ModelStatus struct {
	Model   string `json:"model"`
	Min     int    `json:"min"`
	Max     int    `json:"max"`
	Desired int    `json:"desired"`
	// Current counts the replicas it started and has not stopped,
	// starting ones too; Ready those of them ready for traffic.
	Current int `json:"current"`
	Ready   int `json:"ready"`
	// Draining counts replicas drained by their worker (preempted), no
	// longer counted in Current, stopped once drained.
	Draining int   `json:"draining"`
	Waiting  int   `json:"waiting"`
	Inflight int64 `json:"inflight"`
	// Failures counts consecutive failed starts; NextRetry is when the
	// next start may be tried (nil: no backoff).
	Failures  int        `json:"failures"`
	NextRetry *time.Time `json:"next_retry,omitempty"`
}

// Status is the controller's state and its recent actions, newest first.
type Status struct {
	Provider string        `json:"provider,omitempty"`
	Models   []ModelStatus `json:"models"`
	Actions  []Action      `json:"actions"`
}

// Named is a provider that says its kind ("local", "exec") in [Status].
type Named interface{ Name() string }

// Status returns what the controller manages and did lately.
func (c *Controller) Status() Status {
	st := Status{Actions: c.history.list()}
	if n, ok := c.prov.(Named); ok {
		st.Provider = n.Name()
	}
	now := c.cfg.Now()
	for name, m := range c.cfg.Models {
		ms := ModelStatus{Model: name, Min: m.Min, Max: m.Max, Waiting: c.reg.Waiting(name), Inflight: c.reg.Inflight(name)}
		c.mu.Lock()
		s := c.models[name]
		ms.Desired, ms.Failures = s.desired, s.failures
		if s.retryAt.After(now) {
			t := s.retryAt
			ms.NextRetry = &t
		}
		for _, r := range c.replicas {
			if r.model == name {
				ms.Current++
				if rep := c.reg.Get(r.id); rep != nil && rep.State() == router.StateReady {
					ms.Ready++
				}
			}
		}
		for _, r := range c.retiring {
			if r.model == name {
				ms.Draining++
			}
		}
		c.mu.Unlock()
		st.Models = append(st.Models, ms)
	}
	slices.SortFunc(st.Models, func(a, b ModelStatus) int {
		if a.Model < b.Model {
			return -1
		}
		return 1
	})
	return st
}

// historyLen bounds the recent actions kept.
const historyLen = 100

// history is a ring of the latest actions.
type history struct {
	mu   sync.Mutex
	ring []Action
	next int
}

func (h *history) add(a Action) {
	a.DurationMS = float64(a.Duration.Microseconds()) / 1000
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.ring) < historyLen {
		h.ring = append(h.ring, a)
		return
	}
	h.ring[h.next] = a
	h.next = (h.next + 1) % historyLen
}

// list returns the actions, newest first.
func (h *history) list() []Action {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Action, 0, len(h.ring))
	for i := range h.ring {
		out = append(out, h.ring[(h.next+len(h.ring)-1-i)%len(h.ring)])
	}
	return out
}
