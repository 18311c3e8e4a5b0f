package load

import (
	"maps"
	"slices"
	"time"
)

// window summarizes requests sent in [from, to) and the survivors' queues.
func (a *analysis) windowReport(from, to time.Duration, exclude []string) WindowReport {
	w := WindowReport{FromS: secs(from), ToS: secs(to)}
	var ttft, total []float64
	for i := range a.res.Records {
		r := &a.res.Records[i]
		if r.Intended < from || r.Intended >= to {
			continue
		}
		w.Requests++
		if !r.OK() {
			w.Errors++
			continue
		}
		if r.TTFT >= 0 && a.countsTTFT(r) {
			ttft = append(ttft, ms(r.TTFT))
		}
		if r.Total >= 0 {
			total = append(total, ms(r.Total))
		}
	}
	w.TTFT, w.Total = Summarize(ttft), Summarize(total)
	for _, s := range a.res.Samples {
		if s.At < from || s.At >= to || s.Replicas == nil {
			continue
		}
		w.Samples++
		for _, r := range s.Replicas {
			if slices.Contains(exclude, r.ID) {
				continue
			}
			if r.EngineWaiting > w.PeakWaiting {
				w.PeakWaiting, w.PeakWaitingReplica = r.EngineWaiting, r.ID
			}
			if r.Inflight > w.PeakInflight {
				w.PeakInflight, w.PeakInflightReplica = r.Inflight, r.ID
			}
		}
	}
	return w
}

func after(d time.Duration) *float64 {
	v := ms(d)
	return &v
}

func (a *analysis) failover(ev *Event, scopeEnd time.Duration) FailoverReport {
	kill := ev.At
	f := FailoverReport{AtS: secs(kill), ScopeEndS: secs(scopeEnd), Err: ev.Err, ErrorsByClass: map[string]int{},
		Replacements: []NewReplica{}}
	if len(ev.Replicas) == 0 {
		ev.Replicas, ev.Inferred = a.inferKilled(kill), true
	}
	f.Killed, f.Inferred = ev.Replicas, ev.Inferred
	if f.Killed == nil {
		f.Killed = []string{}
	}
	reps := ev.Replacements
	inferred := false
	if len(reps) == 0 {
		reps, inferred = a.inferNew(kill, scopeEnd, f.Killed), true
	}
	// A killed replica restarted under its own id (a fleet controller's
	// local provider does so) is its own replacement: what it answered
	// after it went down is the replacement's, not routing to the dead one.
	cameBack := map[string]time.Duration{}
	for _, rp := range reps {
		if slices.Contains(f.Killed, rp.ID) {
			cameBack[rp.ID] = rp.At
		}
	}

	// When did the gateway stop using the killed replicas?
	for _, s := range a.res.Samples {
		if s.At < kill || s.Replicas == nil {
			continue
		}
		gone := false
		for _, id := range f.Killed {
			if st, ok := s.find(id); !ok || !st.Ready {
				gone = true
			}
		}
		if gone {
			f.LeftReadyMS = after(s.At - kill)
			break
		}
	}
	for i := range a.res.Records {
		r := &a.res.Records[i]
		if r.Intended >= kill && r.Intended < scopeEnd {
			if back, ok := cameBack[r.Replica]; slices.Contains(f.Killed, r.Replica) && (!ok || r.Intended < back) {
				f.RoutedAfter++
				if f.LastRoutedMS == nil || ms(r.Intended-kill) > *f.LastRoutedMS {
					f.LastRoutedMS = after(r.Intended - kill)
				}
			}
			if r.Attempts > 1 {
				f.Retried++
				if f.LastRetryMS == nil || ms(r.Intended-kill) > *f.LastRetryMS {
					f.LastRetryMS = after(r.Intended - kill)
				}
			}
		}
		// Errors count by when they happened: a stream cut by the kill was
		// sent before it.
		if !r.OK() && r.End() >= kill && r.End() < scopeEnd {
			f.Errors++
			f.ErrorsByClass[r.ErrClass]++
			if r.ErrStage == Midstream {
				f.Midstream++
			} else {
				f.BeforeFirstToken++
			}
		}
	}
	f.After = a.windowReport(kill, min(kill+a.window, max(scopeEnd, kill)), f.Killed)
	f.Before = a.windowReport(max(kill-a.window, 0), kill, f.Killed)

	for _, rp := range reps {
		nr := a.newReplica(rp, kill, scopeEnd, f.Before.TTFT)
		if inferred {
			nr.Inferred, nr.StartMS = true, nil
		}
		f.Replacements = append(f.Replacements, nr)
	}
	return f
}

func (a *analysis) scaleOut(ev *Event, scopeEnd time.Duration) ScaleOutReport {
	at := ev.At
	s := ScaleOutReport{AtS: secs(at), ScopeEndS: secs(scopeEnd), Err: ev.Err, Started: []NewReplica{}}
	var reps []EventReplacement
	for _, id := range ev.Replicas {
		reps = append(reps, EventReplacement{ID: id, At: at})
	}
	inferred := false
	if len(reps) == 0 {
		reps, inferred = a.inferNew(at, scopeEnd, nil), true
		for _, r := range reps {
			ev.Replicas = append(ev.Replicas, r.ID)
		}
		ev.Inferred = len(reps) > 0
	}
	s.Before = a.windowReport(max(at-a.window, 0), at, nil)
	for _, rp := range reps {
		nr := a.newReplica(rp, at, scopeEnd, s.Before.TTFT)
		if inferred {
			nr.Inferred, nr.StartMS = true, nil
		}
		s.Started = append(s.Started, nr)
	}
	for i := len(a.res.Samples) - 1; i >= 0; i-- {
		if smp := a.res.Samples[i]; smp.At < scopeEnd && smp.Replicas != nil {
			for _, r := range smp.Replicas {
				if r.Ready {
					s.ReadyReplicas++
				}
			}
			break
		}
	}
	s.After = a.windowReport(at, min(at+a.window, max(scopeEnd, at)), nil)
	return s
}

// Time to warm performance: a new replica is warm once the TTFT p95 of its
// last WarmRequests answers (at least WarmMinRequests) first comes within
// WarmTolerance of the fleet's steady p95 (the window before the action).
const (
	WarmRequests    = 10
	WarmMinRequests = 5
	WarmTolerance   = 0.25
)

// newReplica computes when a started replica became ready, served, and
// served as fast as the fleet did before (steady: its TTFT before from).
func (a *analysis) newReplica(rp EventReplacement, from, scopeEnd time.Duration, steady Summary) NewReplica {
	nr := NewReplica{ID: rp.ID, StartMS: after(rp.At - from)}
	a.warm(&nr, rp, from, scopeEnd, steady)
	start := max(rp.At, from)
	for _, s := range a.res.Samples {
		if s.At < start || s.At >= scopeEnd {
			continue
		}
		if st, ok := s.find(rp.ID); ok && st.Ready {
			nr.ReadyMS = after(s.At - from)
			break
		}
	}
	var first, firstSent time.Duration = -1, -1
	for i := range a.res.Records {
		r := &a.res.Records[i]
		if !r.OK() || r.Replica != rp.ID || r.Intended < start || r.Intended >= scopeEnd {
			continue
		}
		if t, ok := r.FirstToken(); ok && (first < 0 || t < first) {
			first, firstSent = t, r.Intended
		}
	}
	if first >= 0 {
		nr.ServingMS = after(first - from)
		end := min(firstSent+a.window, scopeEnd)
		var mine, all int
		for i := range a.res.Records {
			r := &a.res.Records[i]
			if r.OK() && r.Replica != "" && r.Intended >= firstSent && r.Intended < end {
				all++
				if r.Replica == rp.ID {
					mine++
				}
			}
		}
		if all > 0 {
			nr.Share = float64(mine) / float64(all)
		}
	}
	return nr
}

// warm sets nr's time to warm performance.
func (a *analysis) warm(nr *NewReplica, rp EventReplacement, from, scopeEnd time.Duration, steady Summary) {
	if steady.N == 0 {
		return
	}
	nr.WarmBaselineMS = steady.P95
	limit := steady.P95 * (1 + WarmTolerance)
	var recent []float64
	for i := range a.res.Records { // in send order
		r := &a.res.Records[i]
		if !r.OK() || r.Replica != rp.ID || r.Intended < max(rp.At, from) || r.Intended >= scopeEnd || !a.countsTTFT(r) {
			continue
		}
		t, ok := r.FirstToken()
		if !ok {
			continue
		}
		recent = append(recent, ms(r.TTFT))
		if len(recent) > WarmRequests {
			recent = recent[1:]
		}
		if len(recent) >= WarmMinRequests && Summarize(slices.Clone(recent)).P95 <= limit {
			nr.WarmMS = after(t - from)
			return
		}
	}
}

// inferKilled works out which replicas a kill took down, for fleets that
// cannot say: from replica samples when there are any (ready just before the
// kill, not ready within the window after), else from responses (served just
// before the kill, never again in the window after it).
func (a *analysis) inferKilled(kill time.Duration) []string {
	var before *ReplicaSample
	for i := range a.res.Samples {
		if s := &a.res.Samples[i]; s.At < kill && s.Replicas != nil {
			before = s
		}
	}
	if before != nil {
		var out []string
		for _, r := range before.Replicas {
			if !r.Ready {
				continue
			}
			for _, s := range a.res.Samples {
				if s.At < kill || s.At > kill+a.window || s.Replicas == nil {
					continue
				}
				if st, ok := s.find(r.ID); !ok || !st.Ready {
					out = append(out, r.ID)
					break
				}
			}
		}
		return out
	}
	servedBefore, servedAfter := map[string]bool{}, map[string]bool{}
	for i := range a.res.Records {
		r := &a.res.Records[i]
		if !r.OK() || r.Replica == "" {
			continue
		}
		switch {
		case r.Intended >= kill-a.window && r.Intended < kill:
			servedBefore[r.Replica] = true
		case r.Intended >= kill+a.window/4 && r.Intended < kill+a.window:
			servedAfter[r.Replica] = true
		}
	}
	if len(servedAfter) == 0 {
		return nil
	}
	var out []string
	for _, id := range slices.Sorted(maps.Keys(servedBefore)) {
		if !servedAfter[id] {
			out = append(out, id)
		}
	}
	return out
}

// inferNew works out which replicas came up after an action, for fleets that
// cannot say: replicas ready in a sample after it that were not ready just
// before it (a killed replica counts once it is ready again), else replicas
// that answered requests after it and none before.
func (a *analysis) inferNew(at, scopeEnd time.Duration, killed []string) []EventReplacement {
	var out []EventReplacement
	seen := map[string]bool{}
	if len(a.res.Samples) > 0 {
		readyBefore := map[string]bool{}
		for _, s := range a.res.Samples {
			if s.At < at && s.Replicas != nil {
				clear(readyBefore)
				for _, r := range s.Replicas {
					readyBefore[r.ID] = r.Ready
				}
			}
		}
		wentDown := map[string]time.Duration{} // when a killed replica was first seen not ready
		for _, s := range a.res.Samples {
			if s.At < at || s.At >= scopeEnd || s.Replicas == nil {
				continue
			}
			for _, id := range killed {
				if _, down := wentDown[id]; down {
					continue
				}
				if st, ok := s.find(id); !ok || !st.Ready {
					wentDown[id] = s.At
				}
			}
			for _, r := range s.Replicas {
				if !r.Ready || seen[r.ID] {
					continue
				}
				down, isDown := wentDown[r.ID]
				switch {
				case !readyBefore[r.ID]:
					seen[r.ID] = true
					out = append(out, EventReplacement{ID: r.ID, At: at})
				case slices.Contains(killed, r.ID) && isDown:
					// Restarted under its own id: it started again once
					// it was seen down.
					seen[r.ID] = true
					out = append(out, EventReplacement{ID: r.ID, At: down})
				}
			}
		}
		return out
	}
	servedBefore := map[string]bool{}
	for i := range a.res.Records {
		if r := &a.res.Records[i]; r.Replica != "" && r.Intended < at {
			servedBefore[r.Replica] = true
		}
	}
	for i := range a.res.Records {
		r := &a.res.Records[i]
		if r.OK() && r.Replica != "" && r.Intended >= at && r.Intended < scopeEnd && !servedBefore[r.Replica] && !seen[r.Replica] {
			seen[r.Replica] = true
			out = append(out, EventReplacement{ID: r.Replica, At: at})
		}
	}
	return out
}
