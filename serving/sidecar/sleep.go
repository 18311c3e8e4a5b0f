package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/tailgate-dev/tailgate/serving"
)

// Sleep mode: the gateway's fleet controller puts an idle replica's engine
// to sleep, and wakes it when requests wait, through the sidecar:
//
//	POST /sleep?level=1|2   (cluster token) the engine's POST /sleep, once
//	                        nothing is in flight; 409 while requests are
//	                        in flight or the replica is not ready
//	POST /wake_up           (cluster token) the engine's POST /wake_up; 200
//	                        once it is awake (at once if it was)
//
// The engine's endpoints are vLLM's development endpoints (served with
// VLLM_SERVER_DEV_MODE=1, working with --enable-sleep-mode; see
// serving/sim/sleep.go for the vLLM versions and files), so the sidecar
// serves these only with [Config.SleepMode]. While the engine sleeps the
// replica reports "sleeping" (never routed to) and refuses generation
// requests with 503 replica_not_ready; while it wakes, "warming". An engine
// that vLLM's sleep mode put to sleep by another hand is seen by the
// metrics scrape (vllm:engine_sleep_state) and reported the same way.

// sleepState is the sidecar's own sleep action, guarded by Sidecar.mu.
type sleepState struct {
	level  int  // the level the sidecar put the engine to sleep at; 0: none
	waking bool // a wake_up is on its way to the engine
	gen    uint64
}

// errSleepOff refuses /sleep and /wake_up on a sidecar without sleep mode;
// the fleet controller reads its code and does not ask that replica again.
var errSleepOff = &apiError{status: http.StatusConflict, typ: "invalid_request_error", code: "sleep_mode_off",
	msg: "this worker's engine runs without sleep mode; restart the worker with --sleep-mode (vLLM then gets --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1)"}

func (s *Sidecar) handlePostSleep(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, errMethod)
		return
	}
	if !s.cfg.SleepMode {
		writeError(w, errSleepOff)
		return
	}
	level := 1
	if v := r.URL.Query().Get("level"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && (n == 1 || n == 2) {
			level = n
		} else {
			writeError(w, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "bad_request",
				msg: "level must be 1 (weights offloaded to CPU memory) or 2 (weights discarded), not " + strconv.Quote(v)})
			return
		}
	}
	s.mu.Lock()
	switch {
	case s.sleep.level != 0:
		s.mu.Unlock()
		writeSleepState(w, serving.StateSleeping, level)
		return
	case s.draining || s.state != serving.StateReady || s.eng.down || s.sleep.waking:
		st, _, _ := s.healthLocked()
		s.mu.Unlock()
		writeError(w, &apiError{status: http.StatusConflict, typ: "invalid_request_error", code: "replica_not_ready",
			msg: "only a ready replica is put to sleep; this one is " + st})
		return
	case s.inflight > 0:
		n := s.inflight
		s.mu.Unlock()
		writeError(w, &apiError{status: http.StatusConflict, typ: "invalid_request_error", code: "replica_busy",
			msg: fmt.Sprintf("%d requests are in flight; a replica is put to sleep only when idle", n)})
		return
	}
	// From here no request is admitted: the engine is going to sleep.
	s.sleep.level = level
	s.sleep.gen++
	s.mu.Unlock()
	if err := s.engineCall(r.Context(), "/sleep?level="+strconv.Itoa(level)); err != nil {
		s.mu.Lock()
		s.sleep.level = 0
		s.mu.Unlock()
		s.log.Warn("engine did not go to sleep", "level", level, "err", err)
		writeError(w, &apiError{status: http.StatusBadGateway, typ: "server_error", code: "engine_error",
			msg: "the engine did not go to sleep: " + err.Error()})
		return
	}
	s.log.Info("engine asleep: replica out of service until the gateway wakes it", "level", level)
	s.stateChanged()
	writeSleepState(w, serving.StateSleeping, level)
}

func (s *Sidecar) handlePostWakeUp(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, errMethod)
		return
	}
	if !s.cfg.SleepMode {
		writeError(w, errSleepOff)
		return
	}
	s.mu.Lock()
	asleep := s.sleep.level != 0 || s.sleepReason() != ""
	if !asleep || s.sleep.waking {
		st, _, _ := s.healthLocked()
		s.mu.Unlock()
		writeSleepState(w, st, 0) // awake, or already waking: the caller watches the state
		return
	}
	s.sleep.waking = true
	s.mu.Unlock()
	s.stateChanged() // warming: the gateway sees the wake on its way
	err := s.engineCall(r.Context(), "/wake_up")
	if err == nil {
		// The last scrape said asleep: read the engine again before saying
		// ready, and void a scrape begun before the wake.
		s.mu.Lock()
		s.sleep.gen++
		s.mu.Unlock()
		if s.scrape(context.WithoutCancel(r.Context())) != nil {
			// vLLM's /wake_up answers once the engine is awake. A reading
			// that did not come in time (a scrape has most of an
			// interval) is no reason to keep the last one, taken while it
			// slept: the next scrape reads the rest.
			s.mu.Lock()
			if e := s.scraped.Load(); e != nil && e.SleepState != serving.SleepAwake && e.SleepState != "" {
				awake := *e
				awake.SleepState = serving.SleepAwake
				s.scraped.Store(&awake)
			}
			s.mu.Unlock()
		}
	}
	s.mu.Lock()
	s.sleep.waking = false
	if err == nil {
		s.sleep.level = 0
	}
	st, _, _ := s.healthLocked()
	s.mu.Unlock()
	s.stateChanged()
	if err != nil {
		s.log.Warn("engine did not wake", "err", err)
		writeError(w, &apiError{status: http.StatusBadGateway, typ: "server_error", code: "engine_error",
			msg: "the engine did not wake: " + err.Error()})
		return
	}
	s.log.Info("engine awake: replica back in service")
	writeSleepState(w, st, 0)
}

// engineCall POSTs path to the engine and wants a 2xx.
func (s *Sidecar) engineCall(ctx context.Context, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.EngineURL()+path, nil)
	if err != nil {
		return err
	}
	s.authorize(req)
	resp, err := s.transport.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("engine answered %s: %s", resp.Status, msg)
	}
	return nil
}

// ownSleepReason says why the replica serves nothing because the sidecar
// put its engine to sleep; "" when it did not. The caller holds mu.
func (s *Sidecar) ownSleepReason() string {
	switch s.sleep.level {
	case 1:
		return "engine asleep (vLLM sleep level 1: weights offloaded to CPU); the gateway wakes it when requests wait"
	case 2:
		return "engine asleep (vLLM sleep level 2: weights discarded); the gateway wakes it when requests wait"
	}
	return ""
}

// writeSleepState answers a sleep or wake with the replica's state.
func writeSleepState(w http.ResponseWriter, state string, level int) {
	body, _ := json.Marshal(struct {
		State string `json:"state"`
		Level int    `json:"level,omitempty"`
	}{state, level})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}
