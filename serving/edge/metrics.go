package edge

import (
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests *prometheus.CounterVec // region, code
	retries  *prometheus.CounterVec // region, reason
	rtt      *prometheus.GaugeVec   // region
	healthy  *prometheus.GaugeVec   // region
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_edge_requests_total",
			Help: "Requests the edge answered, by the region that answered (none: no region could) and HTTP status.",
		}, []string{"region", "code"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_edge_retries_total",
			Help: "Requests sent on to the next region because this one did not run them, by reason: connect (the connection could not be made), failed (the region failed before answering: killed, connection reset), refused (it answered 503).",
		}, []string{"region", "reason"}),
		rtt: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tailgate_edge_region_rtt_seconds",
			Help: "Round trip of the region's status polls (EWMA).",
		}, []string{"region"}),
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tailgate_edge_region_healthy",
			Help: "1 while the region's last status poll succeeded and no connection to it failed since.",
		}, []string{"region"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.retries, m.rtt, m.healthy} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// regionJSON is one region in GET /edge/v1/regions.
type regionJSON struct {
	Name       string  `json:"name"`
	URL        string  `json:"url"`
	Healthy    bool    `json:"healthy"`
	Draining   bool    `json:"draining"`
	RTTSeconds float64 `json:"rtt_seconds"`
	Error      string  `json:"error,omitempty"`
}

func (e *Edge) handleGetRegions(w http.ResponseWriter, _ *http.Request) {
	out := struct {
		Regions []regionJSON        `json:"regions"`
		Routes  map[string][]string `json:"routes"`
	}{Routes: map[string][]string{}}
	for _, r := range e.regions {
		r.mu.Lock()
		out.Regions = append(out.Regions, regionJSON{r.name, r.base, r.healthy, r.draining, r.rtt.Seconds(), r.lastErr})
		r.mu.Unlock()
	}
	for m := range *e.table.Load() {
		key := m
		if key == "" {
			key = "*"
		}
		out.Routes[key] = e.Route(m)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
