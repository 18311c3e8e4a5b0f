package connlimit

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the listeners' connection metrics, shared by every
// [Limiter] and [ErrorLog] of a process.
type Metrics struct {
	conns      *prometheus.GaugeVec
	refused    *prometheus.CounterVec
	idleClosed *prometheus.CounterVec
	waits      *prometheus.CounterVec
	handshakes *prometheus.CounterVec
}

// NewMetrics registers the metrics with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		conns: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tailgate_connections",
			Help: "Client connections open, by listener and state (new: no request yet, active, idle: kept alive between requests)."},
			[]string{"listener", "state"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tailgate_connections_refused_total",
			Help: "Connections closed as soon as accepted, by reason (per_address: their address held its share of the cap), and requests a trusted proxy forwarded that were refused (per_address_forwarded: their client address held its share)."},
			[]string{"listener", "reason"}),
		idleClosed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tailgate_connections_idle_closed_total",
			Help: "Idle keep-alive connections closed to make room for a new one at a connection cap."},
			[]string{"listener"}),
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tailgate_connections_waits_total",
			Help: "New connections that waited to be accepted: the cap was reached and no connection was idle."},
			[]string{"listener"}),
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tailgate_tls_handshake_errors_total",
			Help: "TLS handshakes that failed (logged at most once a minute)."},
			[]string{"listener"}),
	}
	if reg != nil {
		reg.MustRegister(m.conns, m.refused, m.idleClosed, m.waits, m.handshakes)
	}
	return m
}
