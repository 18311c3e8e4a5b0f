package router

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// sessionFleet is a registry with session affinity over replicas a, b, c,
// d on a fixed clock and a seeded rand.
func sessionFleet(t *testing.T, cfg Config) (*Registry, *prometheus.Registry) {
	t.Helper()
	prom := prometheus.NewRegistry()
	rng := rand.New(rand.NewPCG(33, 1))
	now := time.Unix(1000, 0)
	cfg.Affinity, cfg.Registerer = AffinitySession, prom
	cfg.Rand = func(n int) int { return rng.IntN(n) }
	cfg.Now = func() time.Time { return now }
	reg := newRegistry(t, cfg)
	for _, id := range []string{"a", "b", "c", "d"} {
		reg.Add(readyReplica(id, "m"))
	}
	return reg, prom
}

func sessionReq(key uint64) Request { return Request{Hint: Hint{Model: "m", Session: key}} }

// turn serves one request of the session to its first token, gives its
// slot back, and returns the replica that served it.
func turn(t *testing.T, reg *Registry, key uint64) *Replica {
	t.Helper()
	c, err := reg.Do(context.Background(), sessionReq(key), func(context.Context, *Replica, int, AttemptReason) (Attempt, error) {
		return &fakeAttempt{}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	c.Finish()
	return c.Replica
}

func TestSessionSticksToTheReplicaOfItsLastTurn(t *testing.T) {
	reg, prom := sessionFleet(t, Config{})
	const key = 0x5e55
	home := turn(t, reg, key)
	// Load elsewhere and a little more on home (within the bound) does
	// not move it.
	for _, r := range reg.Replicas() {
		if r != home {
			r.inflight.Store(2)
		}
	}
	home.inflight.Store(3) // ⌈1.25 × (9 + 1) / 4⌉ = 4 ≥ 3 + 1
	for i := range 10 {
		if got := turn(t, reg, key); got != home {
			t.Fatalf("turn %d went to %s, want %s, the replica of the last turn", i+2, got.ID, home.ID)
		}
	}
	// Nor do replicas joining that the key's hash may prefer.
	home.inflight.Store(0)
	for i := range 10 {
		reg.Add(readyReplica(fmt.Sprintf("new%d", i), "m"))
		if got := turn(t, reg, key); got != home {
			t.Fatalf("with %d replicas joined the turn went to %s, want %s", i+1, got.ID, home.ID)
		}
	}
	if got := metricValue(t, prom, "tailgate_session_routes_total", "outcome", "stayed"); got != 20 {
		t.Errorf("tailgate_session_routes_total{stayed} = %v, want 20", got)
	}
}

func TestSessionOverHomeLoadBoundMovesOnceAndStays(t *testing.T) {
	reg, prom := sessionFleet(t, Config{})
	const key = 0xbeef
	home := turn(t, reg, key)
	home.inflight.Store(6) // others idle: ⌈1.25 × 7 / 4⌉ = 3 < 6 + 1
	moved := turn(t, reg, key)
	if moved == home {
		t.Fatalf("turn 2 stayed on %s over the load bound", home.ID)
	}
	home.inflight.Store(0) // the old replica is idle again: no move back
	for i := range 10 {
		if got := turn(t, reg, key); got != moved {
			t.Fatalf("turn %d went to %s, want %s where the session moved", i+3, got.ID, moved.ID)
		}
	}
	if got := metricValue(t, prom, "tailgate_session_routes_total", "outcome", "moved_load"); got != 1 {
		t.Errorf("tailgate_session_routes_total{moved_load} = %v, want 1", got)
	}
}

// TestSessionStaysThroughALoadBlipOfAFewRequests: at a request or two per
// replica, a factor of the mean is less than one request, so the factor
// alone would move a session (and its whole prefill) for a blip; the slack
// keeps it home, and a fleet without slack moves it.
func TestSessionStaysThroughALoadBlipOfAFewRequests(t *testing.T) {
	for _, tc := range []struct {
		slack int
		stay  bool
	}{{0, true}, {-1, false}} {
		t.Run(fmt.Sprintf("slack %d", tc.slack), func(t *testing.T) {
			reg, _ := sessionFleet(t, Config{LoadSlack: tc.slack})
			const key = 0xb11b
			home := turn(t, reg, key)
			// Others idle: ⌈1.25 × 3 / 4⌉ = 1 < 2 + 1, but 3/4 + 2 rounds up to 3.
			home.inflight.Store(2)
			if got := turn(t, reg, key); (got == home) != tc.stay {
				t.Fatalf("with 2 in flight on its replica and none elsewhere, the turn went to %s (its replica %s); want stay %v", got.ID, home.ID, tc.stay)
			}
		})
	}
}

func TestSessionWhoseReplicaLeftMovesOnceAndStays(t *testing.T) {
	for _, leave := range []struct {
		name string
		do   func(*Registry, *Replica)
	}{
		{"ejected", func(reg *Registry, r *Replica) { reg.Eject(r, "connect") }},
		{"draining", func(reg *Registry, r *Replica) { reg.Drain(r, "draining") }},
		{"removed", func(reg *Registry, r *Replica) { reg.Remove(r.ID) }},
	} {
		t.Run(leave.name, func(t *testing.T) {
			reg, _ := sessionFleet(t, Config{})
			const key = 0xface
			home := turn(t, reg, key)
			leave.do(reg, home)
			moved := turn(t, reg, key)
			if moved == home {
				t.Fatalf("turn 2 went to %s, which is %s", home.ID, leave.name)
			}
			reg.Add(readyReplica(home.ID, "m")) // back, fresh
			for range 5 {
				if got := turn(t, reg, key); got != moved {
					t.Fatalf("after %s came back the session went to %s, want it to stay on %s", home.ID, got.ID, moved.ID)
				}
			}
		})
	}
}

// TestSessionAffinityKeepsEveryReplicaWithinTheLoadBound: a skewed
// workload — three heavy sessions send most requests, many light ones the
// rest, requests overlap — never puts a replica above the bound over the
// mean, though each session would rather stay on one replica.
func TestSessionAffinityKeepsEveryReplicaWithinTheLoadBound(t *testing.T) {
	reg, prom := sessionFleet(t, Config{})
	rng := rand.New(rand.NewPCG(7, 7))
	open := func(context.Context, *Replica, int, AttemptReason) (Attempt, error) { return &fakeAttempt{}, nil }
	var live []*Call
	for i := range 4000 {
		key := uint64(1 + rng.IntN(3)) // a heavy session: 3 of 4 requests
		if rng.IntN(4) == 0 {
			key = uint64(100 + rng.IntN(200))
		}
		c, err := reg.Do(context.Background(), sessionReq(key), open)
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, c)
		var total, most int64
		for _, r := range reg.Replicas() {
			total += r.Inflight()
			most = max(most, r.Inflight())
		}
		// The bound counts the request being placed: the larger of
		// 1.25 × and 2 more than total / n, rounded up.
		mean := float64(total) / 4
		if limit := int64(math.Ceil(max(1.25*mean, mean+DefaultLoadSlack))); c.Replica.Inflight() > limit {
			t.Fatalf("request %d: %s holds %d of %d in flight, over the bound %d", i, c.Replica.ID, c.Replica.Inflight(), total, limit)
		}
		// Requests end at random; in flight hovers around 40.
		for len(live) > 0 && (len(live) > 48 || rng.IntN(2) == 0) {
			j := rng.IntN(len(live))
			live[j].Finish()
			live[j] = live[len(live)-1]
			live = live[:len(live)-1]
		}
	}
	stayed := metricValue(t, prom, "tailgate_session_routes_total", "outcome", "stayed")
	t.Logf("%v of 4000 requests stayed on their session's replica", stayed)
	if stayed < 2000 {
		t.Errorf("only %v of 4000 requests stayed on their session's replica; affinity should hold most", stayed)
	}
}

// TestSessionHedgeAvoidsItsReplicaAndTheWinnerBecomesHome: the first
// attempt of a turn goes to the session's replica; when it stalls, the
// hedge goes elsewhere, wins, and the next turns follow the winner.
func TestSessionHedgeAvoidsItsReplicaAndTheWinnerBecomesHome(t *testing.T) {
	f := newFleet(t, Config{Affinity: AffinitySession, Hedge: HedgeConfig{Budget: 1, Burst: 100}})
	f.reg.Add(readyReplica("c", "m"))
	for range 100 { // learn a 100ms hedge delay
		f.serve(hint("m"), 100*time.Millisecond, 0)
	}
	const key = 0xabc
	home := f.serve(sessionReq(key), 10*time.Millisecond, 0).Replica
	c := f.serve(sessionReq(key), time.Second, 10*time.Millisecond) // the home stalls
	if !c.Hedged || c.Reason != ReasonHedge {
		t.Fatalf("the stalled turn: hedged %v, won by %v; want a hedge that won", c.Hedged, c.Reason)
	}
	if c.Replica == home {
		t.Fatalf("the hedge went to %s, the session's replica", home.ID)
	}
	lost := c.Losers()
	if len(lost) != 1 || lost[0].Replica != home {
		t.Fatalf("losers %v, want the first attempt on %s", lost, home.ID)
	}
	for i := range 5 {
		if got := f.serve(sessionReq(key), 10*time.Millisecond, 0).Replica; got != c.Replica {
			t.Fatalf("turn %d after the hedge went to %s, want %s, the hedge's winner", i+3, got.ID, c.Replica.ID)
		}
	}
}

func TestSessionTableStaysBounded(t *testing.T) {
	reg, prom := sessionFleet(t, Config{Sessions: 8})
	for key := uint64(1); key <= 100; key++ {
		turn(t, reg, key)
	}
	if n := reg.sessions.len(); n != 8 {
		t.Fatalf("the table holds %d sessions, want its bound 8", n)
	}
	placed := metricValue(t, prom, "tailgate_session_routes_total", "outcome", "placed")
	turn(t, reg, 100) // remembered
	if got := metricValue(t, prom, "tailgate_session_routes_total", "outcome", "placed"); got != placed {
		t.Errorf("the latest session was placed afresh; want it remembered")
	}
	turn(t, reg, 1) // forgotten long ago
	if got := metricValue(t, prom, "tailgate_session_routes_total", "outcome", "placed"); got != placed+1 {
		t.Errorf("the first session was not placed afresh; want it forgotten (LRU)")
	}
}

func TestRequestsWithoutASessionIgnoreTheTable(t *testing.T) {
	reg, prom := sessionFleet(t, Config{})
	turn(t, reg, 0)
	if n := reg.sessions.len(); n != 0 {
		t.Fatalf("a request with no session left %d entries", n)
	}
	if got := metricValue(t, prom, "tailgate_session_routes_total"); got != 0 {
		t.Fatalf("tailgate_session_routes_total = %v for a request naming no session", got)
	}
}

func TestParseAffinity(t *testing.T) {
	for in, want := range map[string]Affinity{"off": AffinityOff, "false": AffinityOff, "prefix": AffinityPrefix,
		"session": AffinitySession, "true": DefaultAffinity} {
		if got, err := ParseAffinity(in); err != nil || got != want {
			t.Errorf("ParseAffinity(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseAffinity("sticky"); err == nil {
		t.Error("ParseAffinity(sticky) gave no error")
	}
}
