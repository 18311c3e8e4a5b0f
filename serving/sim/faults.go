package sim

import (
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// fault is what the engine does to one request instead of serving it.
type fault uint8

const (
	noFault fault = iota
	fault500
	fault429
	faultHang
)

// faultModel decides faults from a seeded source of its own, so enabling
// faults does not shift a seed's latency draws. Every request that passed
// validation consumes one draw, whatever the rates.
type faultModel struct {
	errRate, rateLimitRate, hangRate float64
	retryAfter                       string // seconds, rounded up

	mu  sync.Mutex
	rng *rand.Rand
}

func newFaultModel(cfg Config) *faultModel {
	seed := uint64(cfg.Seed)
	secs := (cfg.RetryAfter + time.Second - 1) / time.Second
	return &faultModel{
		errRate:       cfg.ErrorRate,
		rateLimitRate: cfg.RateLimitRate,
		hangRate:      cfg.HangRate,
		retryAfter:    strconv.FormatInt(int64(secs), 10),
		rng:           rand.New(rand.NewPCG(seed^0x6a09e667f3bcc908, seed+0xbb67ae8584caa73b)),
	}
}

func (m *faultModel) draw() fault {
	m.mu.Lock()
	u := m.rng.Float64()
	m.mu.Unlock()
	switch {
	case u < m.errRate:
		return fault500
	case u < m.errRate+m.rateLimitRate:
		return fault429
	case u < m.errRate+m.rateLimitRate+m.hangRate:
		return faultHang
	}
	return noFault
}

// inject draws the request's fault and, if there is one, answers with it:
// a 500 in vLLM's error shape, a 429 with Retry-After, or a hang (after the
// stream's 200 and its opening events, when it streams) until the client
// goes away. It reports whether it answered.
func (e *Engine) inject(w http.ResponseWriter, r *http.Request, stream bool, enc encoder) bool {
	switch e.faults.draw() {
	case fault500:
		e.faulted.Add(1)
		writeError(w, &apiError{status: http.StatusInternalServerError, typ: "InternalServerError",
			msg: "The simulated engine failed this request (--sim-error-rate)."})
		return true
	case fault429:
		e.faulted.Add(1)
		w.Header().Set("Retry-After", e.faults.retryAfter)
		writeError(w, &apiError{status: http.StatusTooManyRequests, typ: "RateLimitError",
			msg: "The simulated engine is rate limiting this request (--sim-429-rate)."})
		return true
	case faultHang:
		e.faulted.Add(1)
		if stream {
			w.Header()["Content-Type"] = []string{"text/event-stream; charset=utf-8"}
			w.WriteHeader(http.StatusOK)
			if enc != nil {
				if b := enc.open(nil); len(b) > 0 {
					_, _ = w.Write(b)
				}
			}
			_ = http.NewResponseController(w).Flush()
		}
		<-r.Context().Done()
		e.abort(0)
		return true
	}
	return false
}
