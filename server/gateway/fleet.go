package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/serving/fleet"
)

// joinTokenTTL bounds how long a started machine has to register: a VM
// boots and the worker registers (state starting) before its engine loads.
const joinTokenTTL = time.Hour

// UseConfiguredFleet runs the fleet controller Config.Fleet describes, if
// it names models: with the exec provider the operator's scripts, with
// local the provider given (`up`'s child workers). A gateway alone passes
// nil, and local is then refused: it has no workers of its own to start.
// Without models but with Autoscaled, the registry holds requests for
// those models for an outside autoscaler (fleet.Outside).
// Call it before Run.
func (gw *Gateway) UseConfiguredFleet(local fleet.Provider) error {
	fc := gw.cfg.Fleet
	if !fc.Enabled() {
		if fc.Provider == "exec" {
			return errors.New("--fleet-provider exec: no model to manage; list them under fleet.models in --config (or use up --fleet-max N)")
		}
		if len(fc.Autoscaled) > 0 {
			o := &fleet.Outside{Registry: gw.reg, AnyServed: slices.Contains(fc.Autoscaled, "*")}
			o.Listed = slices.DeleteFunc(slices.Clone(fc.Autoscaled), func(m string) bool { return m == "*" })
			gw.reg.SetProvisioner(o)
		}
		return nil
	}
	prov := local
	switch {
	case fc.Provider == "exec":
		prov = gw.execProvider()
	case local == nil:
		return errors.New("--fleet-provider local starts child workers of tailgate up; a gateway alone takes --fleet-provider exec with --fleet-exec-start and --fleet-exec-stop")
	}
	return gw.UseFleet(fleet.Config{Models: fc.Models}, prov)
}

// execProvider runs the operator's scripts of Config.Fleet.Exec.
func (gw *Gateway) execProvider() *fleet.Exec {
	fc := gw.cfg.Fleet
	url := fc.Exec.GatewayURL
	if url == "" {
		url = "http://" + gw.adminAddr
		if gw.node != nil {
			_, port, _ := net.SplitHostPort(gw.adminAddr)
			url = "http://" + net.JoinHostPort(gw.node.Hostname(), port)
		}
	}
	return &fleet.Exec{StartCmd: []string{fc.Exec.Start}, StopCmd: []string{fc.Exec.Stop}, GatewayURL: url,
		ClusterTokenFile: filepath.Join(gw.cfg.DataDir, "cluster.token"), JoinToken: gw.fleetJoinToken}
}

// fleetJoinToken makes the join token of a machine the controller starts
// as replica id. The id is new to the controller, so a credential an
// earlier machine held for it (one orphaned by a gateway that stopped
// without running its stop script) is revoked first: the new machine must
// not be refused as "replica id taken".
func (gw *Gateway) fleetJoinToken(ctx context.Context, id string) (string, error) {
	if w, err := gw.store.RevokeWorker(ctx, id); err == nil && !w.RevokedAt.IsZero() {
		gw.log.Warn("fleet: revoked an earlier worker's credential for a replica id it starts anew", "replica", id, "worker", w.ID)
	} else if err != nil && !errors.Is(err, data.ErrNotFound) {
		return "", fmt.Errorf("revoke earlier credential of %s: %w", id, err)
	}
	_, tok, err := gw.store.CreateInvite(ctx, id, joinTokenTTL)
	return tok, err
}

// SetFleetModels replaces the models Config.Fleet manages (`up
// --fleet-max` names its --model); call it before UseConfiguredFleet.
func (gw *Gateway) SetFleetModels(models map[string]fleet.Model) { gw.cfg.Fleet.Models = models }
