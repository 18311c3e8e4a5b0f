package server

import (
	"net/http"
	"sync/atomic"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/router"
)

// Fleet is the gateway's fleet controller as the server sees it: what GET
// /admin/v1/fleet shows, and a way to make it look now. The gateway role
// fills it from serving/fleet's Controller.
type Fleet struct {
	// Status returns the controller's models and recent actions as a JSON
	// value (fleet.Status).
	Status func() any
	// Wake makes the controller look at model now; it must not block.
	Wake func(model string)
}

// fleetState is the Fleet set by SetFleet; nil: no controller.
type fleetState struct{ p atomic.Pointer[Fleet] }

// SetFleet gives the admin API the fleet controller; call it before Run.
func (s *Server) SetFleet(f Fleet) { s.fleet.p.Store(&f) }

// handleGetFleet shows the fleet controller: per model min, max, desired
// and current replicas, the backoff of a failing provider, and the recent
// actions. Without a controller: no models, no actions.
func (s *Server) handleGetFleet(c echo.Context) error {
	f := s.fleet.p.Load()
	if f == nil || f.Status == nil {
		return c.JSON(http.StatusOK, map[string]any{"provider": nil, "models": []any{}, "actions": []any{}})
	}
	return c.JSON(http.StatusOK, f.Status())
}

// wakeFleet tells the fleet controller at once that a replica of models
// drains (a preemption notice): it starts a replacement now, not when the
// lease runs out.
func (s *Server) wakeFleet(state router.State, models []string) {
	f := s.fleet.p.Load()
	if state != router.StateDraining || f == nil || f.Wake == nil {
		return
	}
	for _, m := range models {
		f.Wake(m)
	}
}
