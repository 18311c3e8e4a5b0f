package server

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/apierr"
	"github.com/tailgate-dev/tailgate/serving"
)

// regionCacheTTL is how long one encoded status is served: an edge polls
// every second, and many edges polling must cost the gateway one encoding
// per TTL, not one per poll (BenchmarkRegionStatus).
const regionCacheTTL = 250 * time.Millisecond

// regionState is the server's regional status: its name, the draining
// flag and the cached JSON. Its zero value is ready to use.
type regionState struct {
	name     atomic.Pointer[string]
	draining atomic.Bool

	mu      sync.Mutex // one encoding at a time; polls in between get the cache
	cache   atomic.Pointer[regionJSON]
	cacheAt atomic.Int64 // unix nanoseconds of cache
}

type regionJSON struct{ body []byte }

// SetRegion names the region this gateway serves in its status ("" if
// not set).
func (s *Server) SetRegion(name string) { s.region.name.Store(&name) }

// SetDraining says whether the gateway is draining: its status says so at
// once, so edges send it no new requests while it finishes the ones it
// has.
func (s *Server) SetDraining(on bool) {
	s.region.draining.Store(on)
	s.region.cacheAt.Store(0)
}

var errBadEdgeToken = &apierr.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_edge_token",
	Message: "the regional status is served to edges only: send the gateway's edge token (DIR/edge.token) as a bearer token (tailgate edge --edge-token-file, the Worker's EDGE_TOKEN)"}

// handleGetRegionStatus serves [serving.RegionStatusPath] from a cache refreshed
// at most every regionCacheTTL.
func (s *Server) handleGetRegionStatus(c echo.Context) error {
	// Edges only: the status lists every model and its load.
	if tok := bearer(c.Request()); s.cfg.EdgeToken == "" || tok == "" || subtle.ConstantTimeCompare([]byte(tok), []byte(s.cfg.EdgeToken)) != 1 {
		return apierr.Reply(c, errBadEdgeToken)
	}
	body := s.regionStatusJSON(time.Now())
	h := c.Response().Header()
	h.Set("Cache-Control", "no-store")
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, body)
}

func (s *Server) regionStatusJSON(now time.Time) []byte {
	rs := &s.region
	if j := rs.cache.Load(); j != nil && now.UnixNano()-rs.cacheAt.Load() < int64(regionCacheTTL) {
		return j.body
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if j := rs.cache.Load(); j != nil && now.UnixNano()-rs.cacheAt.Load() < int64(regionCacheTTL) {
		return j.body // another poll refreshed it while this one waited
	}
	st := s.regionStatus(now)
	body, err := json.Marshal(st)
	if err != nil { // a struct of plain fields: cannot happen
		return []byte(`{}`)
	}
	rs.cache.Store(&regionJSON{body: body})
	rs.cacheAt.Store(now.UnixNano())
	return body
}

// regionStatus takes the status now. A gateway drains when told so
// (SetDraining, on shutdown) or when every replica it has is draining.
func (s *Server) regionStatus(now time.Time) serving.RegionStatus {
	st := serving.RegionStatus{Draining: s.region.draining.Load(), Models: []serving.RegionModel{}, Time: now.UTC()}
	if n := s.region.name.Load(); n != nil {
		st.Region = *n
	}
	for _, c := range policy.Classes {
		st.Queued += s.queue.Waiting(c)
	}
	reps := s.reg.Replicas()
	byModel := map[string]*serving.RegionModel{}
	est := map[string][]time.Duration{}
	draining := 0
	for _, rep := range reps {
		st.Inflight += rep.Inflight()
		if rep.State() == router.StateDraining {
			draining++
		}
		if rep.State() != router.StateReady {
			continue
		}
		load := rep.Load()
		for _, m := range rep.Models() {
			rm := byModel[m]
			if rm == nil {
				rm = &serving.RegionModel{ID: m}
				byModel[m] = rm
			}
			rm.ReadyReplicas++
			rm.Inflight += rep.Inflight()
			rm.Waiting += load.Waiting
			rm.Slots += rep.Slots()
			if e := rep.TTFTEstimate(); e > 0 {
				est[m] = append(est[m], e)
			}
		}
	}
	if draining > 0 && draining == len(reps) {
		st.Draining = true
	}
	for _, rm := range byModel {
		if d, ok := s.reg.RecentTTFT(rm.ID, 0.5); ok {
			rm.TTFTP50 = d.Seconds()
			if d95, ok := s.reg.RecentTTFT(rm.ID, 0.95); ok {
				rm.TTFTP95 = d95.Seconds()
			}
		} else if es := est[rm.ID]; len(es) > 0 {
			var sum time.Duration
			for _, e := range es {
				sum += e
			}
			rm.TTFTP50 = (sum / time.Duration(len(es))).Seconds()
		}
		st.Models = append(st.Models, *rm)
	}
	slices.SortFunc(st.Models, func(a, b serving.RegionModel) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return st
}
