package load

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// PhaseKind names what a phase does.
type PhaseKind string

// Phase kinds. Steady, Burst and Idle last a while and send load; Kill and
// ScaleOut are instant actions on the fleet.
const (
	Steady   PhaseKind = "steady"
	Burst    PhaseKind = "burst"
	Idle     PhaseKind = "idle"
	Kill     PhaseKind = "kill"
	ScaleOut PhaseKind = "scaleout"
)

// Phase is one element of a --phases list.
type Phase struct {
	Kind PhaseKind
	// Duration of a timed phase (steady, burst, idle); 0 for actions.
	Duration time.Duration
	// Factor multiplies the base load during a timed phase: 1 for steady,
	// N for burst:D:xN, 0 for idle.
	Factor float64
	// Count is how many replicas a kill or scaleout acts on.
	Count int
}

// Timed reports whether the phase lasts a while (rather than being an action).
func (p Phase) Timed() bool { return p.Kind == Steady || p.Kind == Burst || p.Kind == Idle }

// String renders the phase as it is written in --phases.
func (p Phase) String() string {
	switch p.Kind {
	case Burst:
		return fmt.Sprintf("burst:%s:x%s", p.Duration, trimFloat(p.Factor))
	case Kill, ScaleOut:
		return fmt.Sprintf("%s:%d", p.Kind, p.Count)
	}
	return fmt.Sprintf("%s:%s", p.Kind, p.Duration)
}

// maxPlanLength bounds a whole run's phases, so every run ends.
const maxPlanLength = 24 * time.Hour

// ParsePhases parses a comma-separated phase list such as
// "steady:30s,burst:10s:x3,kill:1,steady:20s,scaleout:1,steady:20s".
//
//	steady:DUR        the base load (--rate or --concurrency) for DUR
//	burst:DUR:xN      N times the base load for DUR (N may be fractional)
//	idle:DUR          no load for DUR
//	kill[:N]          kill N replicas (default 1)
//	scaleout[:N]      start N more replicas (default 1)
func ParsePhases(s string) ([]Phase, error) {
	var out []Phase
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		p, err := parsePhase(item)
		if err != nil {
			return nil, fmt.Errorf("phase %q: %w", item, err)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, errors.New("no phases")
	}
	return out, nil
}

func parsePhase(item string) (Phase, error) {
	parts := strings.Split(item, ":")
	kind := PhaseKind(strings.ToLower(parts[0]))
	args := parts[1:]
	dur := func() (time.Duration, error) {
		if len(args) == 0 {
			return 0, errors.New("needs a duration, e.g. " + string(kind) + ":30s")
		}
		d, err := time.ParseDuration(args[0])
		if err != nil || d <= 0 {
			return 0, fmt.Errorf("duration %q: want a positive Go duration like 30s or 500ms", args[0])
		}
		return d, nil
	}
	switch kind {
	case Steady, Idle:
		if len(args) > 1 {
			return Phase{}, errors.New("too many fields")
		}
		d, err := dur()
		if err != nil {
			return Phase{}, err
		}
		f := 1.0
		if kind == Idle {
			f = 0
		}
		return Phase{Kind: kind, Duration: d, Factor: f}, nil
	case Burst:
		if len(args) != 2 {
			return Phase{}, errors.New("want burst:DURATION:xFACTOR, e.g. burst:10s:x3")
		}
		d, err := dur()
		if err != nil {
			return Phase{}, err
		}
		fs := strings.TrimSuffix(strings.TrimPrefix(strings.ToLower(args[1]), "x"), "x")
		f, err := strconv.ParseFloat(fs, 64)
		if err != nil || f <= 0 || f > 1000 {
			return Phase{}, fmt.Errorf("factor %q: want x2, x3, x1.5 … (at most x1000)", args[1])
		}
		return Phase{Kind: Burst, Duration: d, Factor: f}, nil
	case Kill, ScaleOut:
		n := 1
		switch len(args) {
		case 0:
		case 1:
			v, err := strconv.Atoi(args[0])
			if err != nil || v < 1 || v > 64 {
				return Phase{}, fmt.Errorf("count %q: want a number of replicas from 1 to 64", args[0])
			}
			n = v
		default:
			return Phase{}, errors.New("too many fields")
		}
		return Phase{Kind: kind, Count: n}, nil
	}
	return Phase{}, fmt.Errorf("unknown kind %q: want steady, burst, idle, kill or scaleout", parts[0])
}

// FormatPhases renders phases back as a --phases value.
func FormatPhases(ps []Phase) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// Span is a timed phase placed on the run's timeline.
type Span struct {
	Index  int           // 0-based among timed phases
	Name   string        // e.g. "2 burst x3"
	Kind   PhaseKind     // steady, burst or idle
	Start  time.Duration // from the start of the run
	End    time.Duration
	Factor float64
}

// Action is a kill or scaleout placed on the run's timeline.
type Action struct {
	Kind  PhaseKind
	Count int
	At    time.Duration // planned time, from the start of the run
}

// Plan is the timeline of a phase list: load spans back to back, actions at
// the boundary where they were written.
type Plan struct {
	Phases  []Phase
	Spans   []Span
	Actions []Action
	Length  time.Duration
}

// NewPlan lays phases out on a timeline.
func NewPlan(phases []Phase) (Plan, error) {
	p := Plan{Phases: phases}
	var t time.Duration
	for _, ph := range phases {
		if !ph.Timed() {
			p.Actions = append(p.Actions, Action{Kind: ph.Kind, Count: ph.Count, At: t})
			continue
		}
		name := fmt.Sprintf("%d %s", len(p.Spans)+1, ph.Kind)
		if ph.Kind == Burst {
			name += " x" + trimFloat(ph.Factor)
		}
		p.Spans = append(p.Spans, Span{Index: len(p.Spans), Name: name, Kind: ph.Kind, Start: t, End: t + ph.Duration, Factor: ph.Factor})
		t += ph.Duration
		if t > maxPlanLength {
			return Plan{}, fmt.Errorf("phases last longer than %s", maxPlanLength)
		}
	}
	if len(p.Spans) == 0 {
		return Plan{}, errors.New("phases need at least one timed phase (steady, burst or idle)")
	}
	p.Length = t
	return p, nil
}

// SpanAt returns the index of the span containing offset t (the last one for
// t at or past the end, the first for t before the start).
func (p Plan) SpanAt(t time.Duration) int {
	for i, s := range p.Spans {
		if t < s.End {
			return i
		}
	}
	return len(p.Spans) - 1
}

func trimFloat(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
