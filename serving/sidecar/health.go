package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"time"

	"github.com/tailgate-dev/tailgate/serving"
)

// engineHealth is what the sidecar's own probes say about an engine the
// launcher reported ready: the launcher watches the process, not whether it
// still answers. Guarded by Sidecar.mu.
type engineHealth struct {
	gen      uint64    // bumped by every SetState: probes started before are void
	lastGood time.Time // last 200 from /health, or when the replica became ready
	down     bool      // no good answer for UnhealthyAfter
	reason   string    // why, while down
	// answer is the last definite failure since lastGood (an error status,
	// a refused connection): a probe that then times out on a slow machine
	// does not hide that the engine answered 503.
	answer string
}

// watchEngine asks the engine's /health every HealthInterval while the
// replica is ready, until ctx ends.
func (s *Sidecar) watchEngine(ctx context.Context) {
	t := time.NewTicker(s.cfg.HealthInterval)
	defer t.Stop()
	for {
		s.checkEngine(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// checkEngine probes the engine once and records the verdict. A probe waits
// until the engine has been silent for UnhealthyAfter (at least
// HealthInterval), so a frozen engine is declared down by the probe that
// times out, as soon as it has been silent that long.
func (s *Sidecar) checkEngine(ctx context.Context) {
	s.mu.Lock()
	watching := s.state == serving.StateReady && !s.draining
	gen, lastGood := s.eng.gen, s.eng.lastGood
	s.mu.Unlock()
	url := s.cfg.EngineURL()
	if !watching || url == "" {
		return
	}
	wait := max(time.Until(lastGood.Add(s.cfg.UnhealthyAfter)), s.cfg.HealthInterval)
	err := s.probeEngine(ctx, url, wait)
	if ctx.Err() != nil {
		return
	}
	now := time.Now()

	s.mu.Lock()
	if s.eng.gen != gen {
		s.mu.Unlock()
		return // the launcher changed the state meanwhile: this probe says nothing
	}
	wasDown := s.eng.down
	silent := now.Sub(s.eng.lastGood)
	switch {
	case err == nil:
		s.eng.lastGood, s.eng.down, s.eng.reason, s.eng.answer = now, false, "", ""
	case !errors.Is(err, errProbeTimedOut):
		s.eng.answer = err.Error()
	}
	if err != nil && silent >= s.cfg.UnhealthyAfter {
		why := err.Error()
		if errors.Is(err, errProbeTimedOut) && s.eng.answer != "" {
			why = s.eng.answer
		}
		s.eng.down = true
		s.eng.reason = fmt.Sprintf("engine not answering /health for %s (%s)", silent.Round(100*time.Millisecond), why)
	}
	down, reason := s.eng.down, s.eng.reason
	s.mu.Unlock()

	switch {
	case down && !wasDown:
		s.log.Warn("engine not answering: replica out of service", "reason", reason)
		s.stateChanged()
	case !down && wasDown:
		s.log.Info("engine answers again: replica back in service", "silent_for", silent.Round(time.Millisecond))
		s.stateChanged()
	}
}

// errProbeTimedOut: the engine did not answer /health within the wait.
var errProbeTimedOut = errors.New("timed out")

// probeEngine asks url's /health once, waiting at most wait.
func (s *Sidecar) probeEngine(ctx context.Context, url string, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
	if err != nil {
		return err
	}
	s.authorize(req) // vLLM leaves /health open; a future one may not
	resp, err := s.transport.RoundTrip(req)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return errProbeTimedOut
	case errors.Is(err, syscall.ECONNREFUSED):
		return errors.New("connection refused")
	case err != nil:
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("answered %s", resp.Status)
	}
	return nil
}

// stateChanged tells OnStateChange the state State now reports.
func (s *Sidecar) stateChanged() {
	if s.cfg.OnStateChange != nil {
		state, reason := s.State()
		s.cfg.OnStateChange(state, reason)
	}
}
