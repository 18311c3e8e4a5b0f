package server_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// fleetOf stands in for the fleet controller: it manages models and can
// start a replica of each.
type fleetOf []string

func (f fleetOf) CanStart(m string) bool { return slices.Contains(f, m) }
func (f fleetOf) CanWake(string) bool    { return false }
func (f fleetOf) Wake(string)            {}
func (f fleetOf) Models() []string       { return f }

// TestScaledToZeroFleetIsHealthyAndListed: with no ready replica at all, a
// gateway whose fleet controller manages a model keeps /healthz's contract
// (503 until a replica is ready) but says why and names /readyz, and lists
// the model (GET /v1/models and
// /v1/models/{id}), since a request for it is held while a replica starts;
// without a fleet the same gateway is 503 and lists nothing.
func TestScaledToZeroFleetIsHealthyAndListed(t *testing.T) {
	g := servertest.Start(t, servertest.Options{Replicas: 1})
	key := g.Key(policy.KeyOptions{})
	if !g.Reg.Get("sim-a").SetState(router.StateDraining, "going away") {
		t.Fatal("cannot take the only replica out of service")
	}
	healthz := func() (int, map[string]any) {
		resp, err := http.Get(g.Public.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, body
	}
	models := func() []string {
		resp := g.Do(http.MethodGet, "/v1/models", key, "", nil)
		defer resp.Body.Close()
		var list struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range list.Data {
			ids = append(ids, m.ID)
		}
		return ids
	}
	one := func(id string) int {
		resp := g.Do(http.MethodGet, "/v1/models/"+id, key, "", nil)
		resp.Body.Close()
		return resp.StatusCode
	}

	if code, body := healthz(); code != http.StatusServiceUnavailable || body["status"] != "no ready replica" {
		t.Errorf("no replica, no fleet: /healthz %d %v, want 503 no ready replica", code, body)
	}
	if ids := models(); len(ids) != 0 || one("cold") != http.StatusNotFound {
		t.Errorf("no replica, no fleet: /v1/models %v, /v1/models/cold %d; want nothing", ids, one("cold"))
	}

	g.Reg.SetProvisioner(fleetOf{"cold"})
	code, body := healthz()
	if code != http.StatusServiceUnavailable || body["ready_replicas"] != 0.0 {
		t.Errorf("scaled to zero: /healthz %d %v, want 503 with 0 ready replicas", code, body)
	}
	if reason, _ := body["reason"].(string); !strings.Contains(reason, "cold") || !strings.Contains(reason, "held") || !strings.Contains(reason, "/readyz") {
		t.Errorf("scaled to zero: /healthz reason %q; want it to name the model, say requests are held and name /readyz", reason)
	}
	if ids := models(); !slices.Equal(ids, []string{"cold"}) {
		t.Errorf("scaled to zero: /v1/models %v, want [cold]", ids)
	}
	if c := one("cold"); c != http.StatusOK {
		t.Errorf("scaled to zero: /v1/models/cold %d, want 200", c)
	}
}
