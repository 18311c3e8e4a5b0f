package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/tailgate-dev/tailgate/router"
)

// Sleep instead of stop.
//
// A replica idle past its model's SleepAfter is put to vLLM sleep (level
// SleepLevel) instead of being stopped: the process, its CUDA graphs and
// compiled kernels stay, level 1 keeps the weights in host memory, and a
// wake is seconds where a start is a minute or more. The registry never
// routes to a sleeping replica; when requests wait for a model whose
// replicas sleep, the registry tells the controller (Provisioner.Wake) and
// the controller wakes one, through its sidecar, before it would start
// another. A replica still idle after IdleAfter is stopped as before.
//
// The controller is the one that wakes because it already owns the
// "requests wait: add capacity" decision, with its bounded, counted,
// logged actions: a wake is the cheapest capacity it can add. Waking from
// the request path (server/hold.go) would be a second actor deciding the
// same thing, and would race the controller's start.

// Sleeper puts a replica's engine to sleep and wakes it; both are called
// with a deadline.
type Sleeper interface {
	Sleep(ctx context.Context, rep *router.Replica, level int) error
	Wake(ctx context.Context, rep *router.Replica) error
}

// ErrSleepModeOff is what a Sleeper returns for a replica whose engine runs
// without sleep mode: the controller does not ask that replica again.
var ErrSleepModeOff = errors.New("the replica's engine runs without sleep mode (start its worker with --sleep-mode)")

// Sidecars is a [Sleeper] that calls the replicas' sidecars: POST
// {replica URL}/sleep?level=N and POST {replica URL}/wake_up with the
// cluster token (see serving/sidecar/sleep.go).
type Sidecars struct {
	// Transport reaches the sidecars (the gateway's, which dials over the
	// tailnet in mesh mode). Required.
	Transport http.RoundTripper
	// ClusterToken is the bearer token the sidecars want. Required.
	ClusterToken string
}

func (s *Sidecars) Sleep(ctx context.Context, rep *router.Replica, level int) error {
	return s.call(ctx, rep, "/sleep?level="+strconv.Itoa(level))
}

func (s *Sidecars) Wake(ctx context.Context, rep *router.Replica) error {
	return s.call(ctx, rep, "/wake_up")
}

func (s *Sidecars) call(ctx context.Context, rep *router.Replica, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rep.URL+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+s.ClusterToken)
	resp, err := s.Transport.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(raw, &e)
	if e.Error.Code == "sleep_mode_off" {
		return ErrSleepModeOff
	}
	if e.Error.Message == "" {
		e.Error.Message = string(raw)
	}
	return fmt.Errorf("sidecar of %s answered %s to POST %s: %s", rep.ID, resp.Status, path, e.Error.Message)
}

// CanWake reports whether the controller wakes the sleeping replicas of
// model: it manages the model and has a Sleeper.
func (c *Controller) CanWake(model string) bool {
	_, ok := c.cfg.Models[model]
	return ok && c.cfg.Sleeper != nil
}

// reconcileSleep puts the model's idle replicas to sleep, or wakes one
// when requests wait (or in-flight load calls for more capacity) and none
// is already starting or waking. It reports whether it woke one, in which
// case the caller starts none this round.
func (c *Controller) reconcileSleep(ctx context.Context, name string, m Model, want bool, idle bool) bool {
	if c.cfg.Sleeper == nil {
		return false
	}
	if want {
		sleepers := c.reg.Sleeping(name)
		c.mu.Lock()
		for _, rep := range sleepers {
			if c.sleepOps[rep.ID] {
				c.mu.Unlock()
				return true // a wake is under way: that is the capacity coming
			}
		}
		c.mu.Unlock()
		for _, rep := range sleepers {
			if !c.claim(rep.ID) {
				continue
			}
			c.log.Info("fleet: waking a sleeping replica", "model", name, "replica", rep.ID, "waiting", c.reg.Waiting(name))
			c.acting.Go(func() {
				defer c.unclaim(rep.ID)
				err := c.act(ctx, name, "wake", func(ctx context.Context) error { return c.cfg.Sleeper.Wake(ctx, rep) })
				if err != nil {
					c.backoff(name, rep.ID, err)
					return
				}
				c.mu.Lock()
				c.models[name].failures = 0
				c.mu.Unlock()
			})
			return true
		}
		return false
	}
	if m.SleepAfter <= 0 || !idle {
		return false
	}
	c.mu.Lock()
	var asleep []*router.Replica
	for _, r := range c.replicas {
		if r.model != name || r.noSleep {
			continue
		}
		if rep := c.reg.Get(r.id); rep != nil && rep.State() == router.StateReady && rep.Inflight() == 0 {
			asleep = append(asleep, rep)
		}
	}
	c.mu.Unlock()
	for _, rep := range asleep {
		if !c.claim(rep.ID) {
			continue
		}
		c.log.Info("fleet: putting an idle replica to sleep", "model", name, "replica", rep.ID, "level", m.SleepLevel, "idle_for", m.SleepAfter)
		c.acting.Go(func() {
			defer c.unclaim(rep.ID)
			// Out of routing before the sidecar stops admitting: a request
			// picked during the sleep call would reach a sidecar that
			// refuses it (503 replica_not_ready) with no other replica to
			// retry on. Marked sleeping first, it is held and wakes the
			// replica once the sleep is done.
			rep.SetState(router.StateSleeping, "going to sleep")
			err := c.act(ctx, name, "sleep", func(ctx context.Context) error { return c.cfg.Sleeper.Sleep(ctx, rep, m.SleepLevel) })
			if err != nil && rep.State() == router.StateSleeping {
				rep.SetState(router.StateReady, "") // still awake: busy, or no sleep mode
			}
			if errors.Is(err, ErrSleepModeOff) {
				c.mu.Lock()
				for _, r := range c.replicas {
					if r.id == rep.ID {
						r.noSleep = true // not asked again: it would only fail again
					}
				}
				c.mu.Unlock()
			}
		})
	}
	return false
}

// claim marks a sleep or wake of id under way; false if one already is.
func (c *Controller) claim(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sleepOps[id] {
		return false
	}
	if c.sleepOps == nil {
		c.sleepOps = map[string]bool{}
	}
	c.sleepOps[id] = true
	return true
}

func (c *Controller) unclaim(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.sleepOps, id)
}

// backoff delays the model's next capacity action after a failed wake, as
// after a failed start.
func (c *Controller) backoff(model, id string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.models[model]
	st.failures++
	wait := min(c.cfg.Backoff<<min(st.failures-1, 20), c.cfg.MaxBackoff)
	st.retryAt = c.cfg.Now().Add(wait)
	c.log.Warn("fleet: wake failed; retrying after backoff", "model", model, "replica", id, "failures", st.failures, "in", wait, "err", err)
}
