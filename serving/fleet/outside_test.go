package fleet

import (
	"testing"

	"github.com/tailgate-dev/tailgate/router"
)

// TestOutsideHoldsForListedAndServedModels: with an outside autoscaler, a
// request for a listed model is held at zero replicas, as is one for a
// model a replica served (draining now) when AnyServed; any other model is
// not, and nothing is woken.
func TestOutsideHoldsForListedAndServedModels(t *testing.T) {
	reg, err := router.New(router.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rep := router.NewReplica("w1", "http://w1")
	rep.SetModels([]string{"served"})
	rep.SetState(router.StateDraining, "worker shutting down") // scaled in: gone soon
	reg.Add(rep)
	for _, tc := range []struct {
		o    *Outside
		held map[string]bool
	}{
		{&Outside{Registry: reg}, map[string]bool{"listed": false, "served": false, "other": false}},
		{&Outside{Registry: reg, Listed: []string{"listed"}}, map[string]bool{"listed": true, "served": false, "other": false}},
		{&Outside{Registry: reg, Listed: []string{"listed"}, AnyServed: true}, map[string]bool{"listed": true, "served": true, "other": false}},
	} {
		reg.SetProvisioner(tc.o)
		for model, want := range tc.held {
			if got := reg.Holdable(model); got != want {
				t.Errorf("%+v: %s held %v, want %v", tc.o, model, got, want)
			}
			if tc.o.CanWake(model) {
				t.Errorf("%s: an outside autoscaler wakes nothing", model)
			}
		}
	}
}
