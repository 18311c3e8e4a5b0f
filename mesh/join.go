package mesh

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"tailscale.com/client/local"
	"tailscale.com/ipn"
	"tailscale.com/ipn/ipnstate"
	"tailscale.com/tsnet"
)

// progressEvery is how often Up says it is still waiting.
const progressEvery = 5 * time.Second

// relayWait bounds how long Up waits for the home relay once the node
// runs: a node without one still works over direct paths, so Up goes on
// with a warning instead of spending the whole UpTimeout.
const relayWait = 15 * time.Second

// joiner follows a starting node's state until it runs or cannot.
type joiner struct {
	srv *tsnet.Server
	lc  *local.Client
	cfg Config
}

// run waits for the node to be running and its home relay connected, and
// returns its status. tsnet.Server.Up alone would wait forever for a login
// that nobody gives and would say nothing while the control server is
// unreachable; run turns both into errors and reports progress.
func (j *joiner) run(ctx context.Context) (*ipnstate.Status, error) {
	start := time.Now()
	deadline := time.NewTimer(j.cfg.UpTimeout)
	defer deadline.Stop()

	if err := j.awaitRunning(ctx, start, deadline.C); err != nil {
		return nil, err
	}
	// tsnet's Up returns at once now; it also clears stale serve state.
	upCtx, cancel := context.WithTimeout(ctx, j.cfg.UpTimeout-time.Since(start))
	defer cancel()
	st, err := j.srv.Up(upCtx)
	if err != nil {
		return nil, fmt.Errorf("mesh: %w", err)
	}
	// Until the home relay (DERP) has seen us, peers' first packets to us
	// are dropped and their first dial stalls; wait for it, but a node
	// that is running is usable, so this only delays, never fails.
	relayDeadline := time.NewTimer(min(relayWait, max(0, j.cfg.UpTimeout-time.Since(start))))
	defer relayDeadline.Stop()
	if !j.awaitHomeRelay(ctx, relayDeadline.C) {
		j.warnNoRelay(ctx)
	}
	return st, nil
}

// warnNoRelay says that no relay (DERP) server was reached, which relays
// the tailnet offers, and, behind an http:// control server, the likely
// cause: Tailscale clients speak only TLS to relays
// (tailscale.com/derp/derphttp, Client.useHTTPS), so a Headscale serving
// plain http cannot offer its embedded DERP server.
func (j *joiner) warnNoRelay(ctx context.Context) {
	control := controlURL(j.cfg.ControlURL)
	msg := "mesh: running, but no relay (DERP) server reached: peers that cannot reach this node directly cannot connect to it, and first connections may be slow"
	if strings.HasPrefix(control, "http://") {
		msg += "; the control server is plain http://, and Tailscale nodes speak only TLS to relays, so a Headscale on http:// cannot relay with its embedded DERP server: serve Headscale over https (server_url) or keep Tailscale's public relays in its DERP map (derp.urls)"
	}
	j.cfg.Log.Warn(msg, "control", control, "relays", j.relays(ctx), "problems", j.problems(ctx))
}

// relays lists the relay servers the control server's DERP map offers,
// as host:port.
func (j *joiner) relays(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	dm, err := j.lc.CurrentDERPMap(ctx)
	if err != nil {
		return "unknown: " + err.Error()
	}
	var out []string
	for _, id := range dm.RegionIDs() {
		for _, n := range dm.Regions[id].Nodes {
			port := n.DERPPort
			if port == 0 {
				port = 443
			}
			out = append(out, fmt.Sprintf("%s:%d", n.HostName, port))
		}
	}
	if len(out) == 0 {
		return "none (the DERP map is empty)"
	}
	return strings.Join(out, ",")
}

func (j *joiner) awaitRunning(ctx context.Context, start time.Time, deadline <-chan time.Time) error {
	ctx, cancel := context.WithCancel(ctx)
	w, err := j.lc.WatchIPNBus(ctx, ipn.NotifyInitialState)
	if err != nil {
		cancel()
		return fmt.Errorf("mesh: watch node state: %w", err)
	}
	notes := make(chan ipn.Notify)
	watchErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			n, err := w.Next()
			if err != nil {
				watchErr <- err
				return
			}
			select {
			case notes <- n:
			case <-ctx.Done():
				return
			}
		}
	})
	defer func() {
		cancel()
		w.Close()
		wg.Wait()
	}()

	control := controlURL(j.cfg.ControlURL)
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	state := ipn.NoState
	for {
		select {
		case n := <-notes:
			if n.ErrMessage != nil {
				return fmt.Errorf("%w: %s says: %s", ErrRefused, control, *n.ErrMessage)
			}
			if n.BrowseToURL != nil && *n.BrowseToURL != "" {
				return &LoginError{URL: *n.BrowseToURL}
			}
			if n.State == nil || *n.State == state {
				continue
			}
			state = *n.State
			switch state {
			case ipn.Running:
				return nil
			case ipn.NeedsMachineAuth:
				j.cfg.Log.Info("mesh: waiting for an administrator to approve this node", "control", control)
			case ipn.NeedsLogin:
				if err := j.keyExpired(ctx, control); err != nil {
					return err
				}
			case ipn.Stopped:
				return errors.New("mesh: node stopped while joining")
			}
		case err := <-watchErr:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("mesh: watch node state: %w", err)
		case <-tick.C:
			if state == ipn.NeedsLogin {
				if err := j.keyExpired(ctx, control); err != nil {
					return err
				}
			}
			j.cfg.Log.Info("mesh: still joining", "control", control, "state", state.String(),
				"elapsed", time.Since(start).Round(time.Second), "problems", j.problems(ctx))
		case <-deadline:
			var why string
			switch state {
			case ipn.NoState, ipn.NeedsLogin:
				why = "control server " + control + " not reached"
			case ipn.NeedsMachineAuth:
				why = "the node still awaits approval by an administrator of " + control
			default:
				why = "control server " + control + " answered, but the node did not start"
			}
			return fmt.Errorf("%w: %s within %v (node state %s; %s)", ErrTimeout, why, j.cfg.UpTimeout, state, j.problems(ctx))
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// keyExpired returns an [ErrRefused] error if the control server has expired
// the node's key. A registered node then needs a login nobody will give, and
// no login URL comes: the control server does this to a node that asks for
// tags it may not have, or an administrator did it.
func (j *joiner) keyExpired(ctx context.Context, control string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := j.lc.StatusWithoutPeers(ctx)
	if err != nil || st.Self == nil || st.Self.KeyExpiry == nil || st.Self.KeyExpiry.After(time.Now()) {
		return nil
	}
	why := "an administrator expired it"
	if len(j.cfg.Tags) > 0 {
		why = fmt.Sprintf("it asked for tags %s, which it may not have, or an administrator expired it", strings.Join(j.cfg.Tags, ","))
	}
	return fmt.Errorf("%w: %s expired the node's key: %s", ErrRefused, control, why)
}

// awaitHomeRelay waits until the node has picked a home DERP region and
// heard from it, as tailscale's own tsnet tests do before dialing.
func (j *joiner) awaitHomeRelay(ctx context.Context, deadline <-chan time.Time) bool {
	sys := j.srv.Sys()
	health, sock := sys.HealthTracker.Get(), sys.MagicSock.Get()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if r := sock.GetLastNetcheckReport(ctx); r != nil && r.PreferredDERP != 0 &&
			!health.GetDERPRegionReceivedTime(r.PreferredDERP).IsZero() {
			return true
		}
		select {
		case <-tick.C:
		case <-deadline:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// problems summarizes what the node's health checks currently complain
// about, the best clue to why a join is slow.
func (j *joiner) problems(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := j.lc.StatusWithoutPeers(ctx)
	switch {
	case err != nil:
		return "status unavailable: " + err.Error()
	case len(st.Health) == 0:
		return "no reported problems"
	}
	return strings.Join(st.Health, "; ")
}

// controlURL names the control server a node uses, given Config.ControlURL.
func controlURL(configured string) string {
	if configured == "" {
		return ipn.DefaultControlURL
	}
	return configured
}
