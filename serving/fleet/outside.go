package fleet

import (
	"slices"

	"github.com/tailgate-dev/tailgate/router"
)

// Outside is the [router.Provisioner] of a gateway whose replicas an
// autoscaler outside it adds — KEDA or an HPA reading
// tailgate_model_waiting_requests (deploy/kubernetes/autoscaling-keda.yaml).
// It starts nothing; it says which models are worth holding requests for
// while none of their replicas is ready, so that at zero replicas a request
// waits in the model's hold queue, the waiting gauge rises, and the
// autoscaler's activation threshold trips. Without it such a request is
// answered 503 no_replica at once and the gauge stays 0.
type Outside struct {
	// Registry is the gateway's: a model one of its replicas serves, in
	// any state (a lost one stays listed for router.Config.ForgetLost), has
	// been served, and is held for when AnyServed.
	Registry *router.Registry
	// Listed are the models held for even before any replica served them
	// (a gateway restarted at zero), and listed by /v1/models meanwhile.
	Listed []string
	// AnyServed holds requests for every model a replica of the registry
	// serves or served, not only Models.
	AnyServed bool
}

// CanStart reports whether requests for model are held: the autoscaler
// starts its replicas.
func (o *Outside) CanStart(model string) bool {
	return slices.Contains(o.Listed, model) || (o.AnyServed && o.Registry.Known(model))
}

// CanWake is false: a sleeping replica is woken by the fleet controller
// only.
func (o *Outside) CanWake(string) bool { return false }

// Wake does nothing: the autoscaler reads the waiting gauge itself.
func (o *Outside) Wake(string) {}

// Models returns Listed: served (listed, healthy) at zero replicas.
func (o *Outside) Models() []string { return o.Listed }
