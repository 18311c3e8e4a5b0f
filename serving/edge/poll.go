package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/tailgate-dev/tailgate/serving"
)

// region is one regional gateway: its address and what its polls said.
type region struct {
	idx  int
	name string
	base string // URL without a trailing slash
	// transport carries its requests; polls carries the status polls: the
	// same over HTTP/2 (one multiplexed connection the polls keep warm), a
	// connection of their own over HTTP/1 (data traffic cannot hold it).
	transport, polls http.RoundTripper

	mu       sync.Mutex
	healthy  bool
	draining bool
	rtt      time.Duration // EWMA of the polls' round trips; 0 before the first
	status   serving.RegionStatus
	lastErr  string
}

// pollAll polls every region at once, each within the poll timeout, and
// then recomputes the routes.
func (e *Edge) pollAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, r := range e.regions {
		wg.Go(func() { e.poll(ctx, r) })
	}
	wg.Wait()
	e.reroute(true)
}

// poll reads one region's status; its round trip (request written to body
// read, on a kept-alive connection) feeds the region's RTT.
func (e *Edge) poll(ctx context.Context, r *region) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.PollTimeout)
	defer cancel()
	start := e.cfg.Now()
	st, err := e.fetchStatus(ctx, r)
	rtt := e.cfg.Now().Sub(start)

	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if r.healthy || r.lastErr == "" {
			e.log.Warn("region unhealthy: status poll failed", "region", r.name, "err", err)
		}
		r.healthy, r.lastErr = false, err.Error()
		e.m.healthy.WithLabelValues(r.name).Set(0)
		return
	}
	if !r.healthy && r.lastErr != "" {
		e.log.Info("region healthy again", "region", r.name)
	}
	if r.rtt == 0 {
		r.rtt = rtt
	} else {
		r.rtt += time.Duration(e.cfg.RTTAlpha * float64(rtt-r.rtt))
	}
	if st.Draining && !r.draining {
		e.log.Info("region draining: no new requests go there", "region", r.name)
	}
	r.healthy, r.draining, r.status, r.lastErr = true, st.Draining, st, ""
	e.m.healthy.WithLabelValues(r.name).Set(1)
	e.m.rtt.WithLabelValues(r.name).Set(r.rtt.Seconds())
}

func (e *Edge) fetchStatus(ctx context.Context, r *region) (serving.RegionStatus, error) {
	var st serving.RegionStatus
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.base+serving.RegionStatusPath, nil)
	if err != nil {
		return st, err
	}
	if e.cfg.StatusToken != "" {
		req.Header.Set("Authorization", "Bearer "+e.cfg.StatusToken)
	}
	resp, err := r.polls.RoundTrip(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return st, err
	}
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("status %d", resp.StatusCode)
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, fmt.Errorf("status is not the region status JSON: %w", err)
	}
	return st, nil
}

// markDown takes a region out at once after a connection to it failed;
// the next successful poll brings it back.
func (e *Edge) markDown(r *region, err error) {
	r.mu.Lock()
	was := r.healthy
	r.healthy, r.lastErr = false, err.Error()
	r.mu.Unlock()
	e.m.healthy.WithLabelValues(r.name).Set(0)
	if was {
		e.log.Warn("region unhealthy: connection failed", "region", r.name, "err", err)
		e.reroute(false)
	}
}

// views copies what the selection reads from each region.
func (e *Edge) views() []regionView {
	out := make([]regionView, len(e.regions))
	for i, r := range e.regions {
		r.mu.Lock()
		v := regionView{idx: r.idx, name: r.name, healthy: r.healthy, draining: r.draining, rtt: r.rtt, models: map[string]modelView{}}
		for _, m := range r.status.Models {
			mv := modelView{ready: m.ReadyReplicas, p50: time.Duration(m.TTFTP50 * float64(time.Second)), unknown: m.TTFTP50 == 0}
			if m.ReadyReplicas > 0 {
				ahead := m.Waiting
				if m.Slots > 0 {
					ahead = max(ahead, float64(m.Inflight-m.Slots))
				}
				mv.queued = max(ahead, 0) / float64(m.ReadyReplicas)
			}
			v.models[m.ID] = mv
		}
		r.mu.Unlock()
		out[i] = v
	}
	return out
}

// reroute recomputes every model's route from the regions' last polls,
// with hysteresis (see route.update for round).
func (e *Edge) reroute(round bool) {
	views := e.views()
	models := map[string]bool{"": true}
	for _, v := range views {
		for m := range v.models {
			models[m] = true
		}
	}
	e.routeMu.Lock()
	defer e.routeMu.Unlock()
	table := make(map[string][]int, len(models))
	for m := range models {
		rt := e.routes[m]
		if rt == nil {
			rt = &route{current: -1, challenger: -1}
			e.routes[m] = rt
		}
		prev := rt.current
		rt.update(rank(views, m, e.cfg.QueueWeight, e.prefer, e.cfg.TieMargin), e.cfg.SwitchMargin, e.cfg.SwitchPolls, round)
		if rt.current != prev && rt.current >= 0 {
			from := "none"
			if prev >= 0 {
				from = e.regions[prev].name
			}
			e.log.Info("route changed", "model", m, "from", from, "to", e.regions[rt.current].name)
		}
		table[m] = rt.order
	}
	e.table.Store(&table)
}

// order returns the regions to try for model, best first; a model no
// region reports is routed as a request that names none.
func (e *Edge) order(model string) []int {
	t := *e.table.Load()
	if o, ok := t[model]; ok {
		return o
	}
	return t[""]
}
