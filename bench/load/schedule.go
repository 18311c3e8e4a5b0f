package load

import (
	"math/rand/v2"
	"time"
)

// Arrival is one request of an open-loop schedule.
type Arrival struct {
	Index int           // request index in the workload
	At    time.Duration // intended send time, from the start of the run
	Span  int           // the timed phase it belongs to
}

// scheduleStream keeps the arrival draws apart from the per-request draws
// (which use the request index as their stream).
const scheduleStream = 0x5c4ed01e5c4ed01e

// OpenLoop returns the arrivals of a Poisson process at rate requests per
// second, times each span's factor, over the plan's timeline. The same plan,
// rate and seed always yield the same schedule.
func OpenLoop(plan Plan, rate float64, seed int64) []Arrival {
	r := rand.New(rand.NewPCG(uint64(seed), scheduleStream))
	var out []Arrival
	for _, s := range plan.Spans {
		lambda := rate * s.Factor
		if lambda <= 0 {
			continue
		}
		t := float64(s.Start)
		for {
			t += r.ExpFloat64() / lambda * float64(time.Second)
			if t >= float64(s.End) {
				break
			}
			out = append(out, Arrival{Index: len(out), At: time.Duration(t), Span: s.Index})
		}
	}
	return out
}
