package connlimit

import (
	"bytes"
	"log"
	"log/slog"
	"sync"
	"time"
)

// ErrorLog returns a logger for http.Server.ErrorLog that writes to l's
// log at WARN, except failed TLS handshakes, which anyone can cause at
// will: they are counted (tailgate_tls_handshake_errors_total) and logged
// at most once a minute, with how many there were since the last line.
func (l *Limiter) ErrorLog() *log.Logger {
	return log.New(&errorWriter{listener: l.cfg.Listener, m: l.m, log: l.log, logs: l.logs}, "", 0)
}

type errorWriter struct {
	listener string
	m        *Metrics
	log      *slog.Logger
	logs     *rateLog
}

var handshakeError = []byte("http: TLS handshake error")

func (w *errorWriter) Write(p []byte) (int, error) {
	msg := string(bytes.TrimSpace(p))
	if bytes.HasPrefix(p, handshakeError) {
		w.m.handshakes.WithLabelValues(w.listener).Inc()
		w.logs.warn(w.listener+"/tls", "TLS handshake failed (counted in tailgate_tls_handshake_errors_total; logged at most once a minute)",
			"listener", w.listener, "last", msg)
		return len(p), nil
	}
	w.log.Warn(msg, "listener", w.listener)
	return len(p), nil
}

// rateLog writes a line per kind of event at most once per interval; the
// next line says how many were left out.
type rateLog struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu    sync.Mutex
	kinds map[string]*rateKind
}

type rateKind struct {
	last    time.Time
	skipped int64
}

func newRateLog(log *slog.Logger, every time.Duration) *rateLog {
	return &rateLog{log: log, every: every, now: time.Now, kinds: make(map[string]*rateKind)}
}

// warn logs msg with args at WARN unless a line of kind was logged within
// the interval.
func (r *rateLog) warn(kind, msg string, args ...any) {
	r.mu.Lock()
	k := r.kinds[kind]
	if k == nil {
		k = &rateKind{}
		r.kinds[kind] = k
	}
	now := r.now()
	if !k.last.IsZero() && now.Sub(k.last) < r.every {
		k.skipped++
		r.mu.Unlock()
		return
	}
	skipped := k.skipped
	k.last, k.skipped = now, 0
	r.mu.Unlock()
	if skipped > 0 {
		args = append(args, "more_since_last_line", skipped)
	}
	r.log.Warn(msg, args...)
}
