package router

import (
	"fmt"
	"math"
	"time"
)

// Selector picks one replica among ready candidates for a request. Each
// policy lives in its own file; the Registry calls Select with at least one
// candidate and never keeps the slice.
type Selector interface {
	Select(cands []*Replica, hint Hint) *Replica
}

// Interface guards.
var (
	_ Selector = (*P2C)(nil)
	_ Selector = (*RoundRobin)(nil)
)

// ParsePolicy returns the Config.Selector for a policy name (the gateway's
// --policy flag): "p2c" (or "") gives nil, which New turns into the
// load-aware [P2C] built from the Config; "round-robin" gives a new
// [RoundRobin], the baseline.
func ParsePolicy(name string) (Selector, error) {
	switch name {
	case "", "p2c":
		return nil, nil
	case "round-robin":
		return &RoundRobin{}, nil
	}
	return nil, fmt.Errorf("router: unknown selection policy %q (want p2c or round-robin)", name)
}

// Hint is what a selector may know of the request.
type Hint struct {
	Model string
	// Prefix is a hash of the prompt's leading part (system prompt), 0 when
	// unknown; prefix-affinity selection keeps equal prefixes together so the
	// engine's prefix cache is reused.
	Prefix uint64
	// Session is a hash of the session the request names (the gateway's
	// x-session-affinity header, prompt_cache_key, user, metadata.user_id),
	// 0 for none; with [AffinitySession] a session's turns stay on one
	// replica within the load bound.
	Session uint64
}

// scoreInputs are the numbers a replica's load score is made of; they are
// also exported as metrics so an operator can see why traffic goes where.
type scoreInputs struct {
	Inflight   float64 // the gateway's own requests on the replica
	Waiting    float64 // the engine's queue, from the last heartbeat
	TTFT       float64 // recent time to first token seen by the gateway, seconds (0: unknown)
	SlowStart  float64 // 1 when warm; below 1 while a fresh replica ramps up
	Score      float64
	BackingOff bool
}

// scorer turns replica state into a comparable cost: the expected wait of
// one more request, (1 + queue) × recent TTFT, inflated while a fresh
// replica ramps up. Lower is better.
type scorer struct {
	now       func() time.Time
	slowStart time.Duration
}

func (s scorer) inputs(r *Replica, fallbackTTFT float64) scoreInputs {
	in := scoreInputs{
		Inflight:  float64(r.Inflight()),
		Waiting:   r.Load().Waiting,
		TTFT:      r.TTFTEstimate().Seconds(),
		SlowStart: 1,
	}
	ttft := in.TTFT
	if ttft <= 0 {
		ttft = fallbackTTFT
	}
	if ttft <= 0 {
		ttft = 1 // nothing known anywhere: compare queues alone
	}
	if s.slowStart > 0 {
		if since := r.readySince(); since != 0 {
			age := s.now().Sub(time.Unix(0, since))
			if age < s.slowStart {
				// From half weight to full: a fresh, empty replica must not
				// draw every new request at once, yet it should take load
				// from busy ones straight away (the launcher warmed it up).
				in.SlowStart = 0.5 + 0.5*math.Max(0, float64(age)/float64(s.slowStart))
			}
		}
	}
	in.Score = (1 + in.Inflight + in.Waiting) * ttft / in.SlowStart
	return in
}

// fallbackTTFT is the mean TTFT estimate over candidates that have one, used
// for replicas that have none yet so they are neither favoured nor shunned.
func fallbackTTFT(cands []*Replica) float64 {
	var sum float64
	n := 0
	for _, r := range cands {
		if t := r.TTFTEstimate(); t > 0 {
			sum += t.Seconds()
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}
