package gateway

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/fleet"
)

// What `tailgate up` needs of the gateway it runs its workers beside.

// EnsureDemoKey makes sure path holds a working API key of tenant "demo".
func (gw *Gateway) EnsureDemoKey(ctx context.Context, path string) error {
	if raw, err := os.ReadFile(path); err == nil {
		if _, err := gw.gate.Authenticate(ctx, strings.TrimSpace(string(raw))); err == nil {
			return nil
		}
		gw.log.Warn("demo key no longer valid; making a new one", "path", path)
	}
	secret, k, err := policy.CreateKey(ctx, gw.store, policy.KeyOptions{Tenant: "demo"})
	if err != nil {
		return fmt.Errorf("demo key: %w", err)
	}
	if err := os.WriteFile(path+".tmp", []byte(secret+"\n"), 0o600); err != nil {
		return fmt.Errorf("demo key: %w", err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return fmt.Errorf("demo key: %w", err)
	}
	gw.log.Info("demo key created", "path", path, "prefix", k.Prefix)
	return nil
}

// ReadyReplicas counts the replicas ready for traffic.
func (gw *Gateway) ReadyReplicas() int {
	ready := 0
	for _, r := range gw.reg.Replicas() {
		if r.State() == router.StateReady {
			ready++
		}
	}
	return ready
}

// ReplicaCounts returns how many replicas are ready and how many are
// registered and not lost (up's own and any other worker's).
func (gw *Gateway) ReplicaCounts() (ready, total int) {
	for _, r := range gw.reg.Replicas() {
		switch r.State() {
		case router.StateReady:
			ready++
			total++
		case router.StateLost:
		default:
			total++
		}
	}
	return ready, total
}

// StopWorkersWith sets how the workers this process started are stopped:
// Run calls stop once no request is left for them and before the admin
// listener closes, so their last heartbeat (draining) still reaches the
// gateway instead of reporting it unreachable. Call it before Run.
func (gw *Gateway) StopWorkersWith(stop func()) { gw.stopWorkers = stop }

// ApproveWorkers admits the workers `up` starts itself, each id's worker
// bound by the key in its data directory (DIR/ID/worker.key, made here if
// missing; the worker reads the same file): the cluster token is all they
// need, and another holder of it cannot take their ids (one revoked comes
// back with the next up).
func (gw *Gateway) ApproveWorkers(ctx context.Context, ids ...string) error {
	for _, id := range ids {
		dir := filepath.Join(gw.cfg.DataDir, id)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("approve %s: %w", id, err)
		}
		key, err := serving.LoadWorkerKey(filepath.Join(dir, "worker.key"))
		if err != nil {
			return fmt.Errorf("approve %s: %w", id, err)
		}
		if _, _, err := gw.store.ApproveWorker(ctx, id, serving.ApprovalCode(key)); err != nil {
			return fmt.Errorf("approve %s: %w", id, err)
		}
	}
	return nil
}

// AdoptWorkers gives each replica id of ids to the worker `up` starts for
// it, whose credential held(id) returns ("" for a worker with none yet): a
// credential for the id the worker does not hold — one a database restored
// from another box brought — is revoked and logged, so the local worker
// registers instead of being refused as another worker's. The ids are then
// approved as [Gateway.ApproveWorkers] does.
func (gw *Gateway) AdoptWorkers(ctx context.Context, held func(id string) string, ids ...string) error {
	for _, id := range ids {
		var hash []byte
		if secret := held(id); secret != "" {
			sum := sha256.Sum256([]byte(secret))
			hash = sum[:]
		}
		w, err := gw.store.AdoptReplicaID(ctx, id, hash)
		if err != nil {
			return err
		}
		if w.ID != "" {
			gw.log.Warn("replica id adopted by this box's worker: the database's credential for it was another worker's (a restored backup?), now revoked",
				"replica", id, "revoked_worker", w.ID, "registered", w.CreatedAt.UTC().Format(time.RFC3339), "address", w.Address)
		}
	}
	return gw.ApproveWorkers(ctx, ids...)
}

// UseFleet runs a fleet controller of cfg's models beside the gateway,
// with capacity from prov: requests for a managed model with no ready
// replica are held while it starts one. Models with a SleepAfter have their
// idle replicas put to sleep and woken through their sidecars. Call it
// before Run; the replicas it started are stopped when Run ends.
func (gw *Gateway) UseFleet(cfg fleet.Config, prov fleet.Provider) error {
	cfg.Registerer = gw.promReg
	for _, m := range cfg.Models {
		if m.SleepAfter > 0 && cfg.Sleeper == nil {
			cfg.Sleeper = gw.sidecars
		}
	}
	c, err := fleet.New(cfg, gw.reg, prov, gw.log)
	if err != nil {
		return err
	}
	gw.fleet = c
	gw.srv.SetFleet(server.Fleet{Status: func() any { return c.Status() }, Wake: c.Wake})
	return nil
}
