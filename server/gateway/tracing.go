package gateway

import (
	"context"
	"time"

	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/serving/tracing"
)

// openTracing starts the OTLP exporter of --otlp-endpoint and gives the
// server its tracer; with no endpoint it does nothing and the server makes
// no spans.
func (gw *Gateway) openTracing(deps *server.Deps) error {
	c := gw.cfg.Tracing
	c.Service = "tailgate-gateway"
	tp, err := tracing.New(c)
	if err != nil || tp == nil {
		return err
	}
	gw.tracer, deps.Tracer = tp, tp
	gw.log.Info("tracing: OpenTelemetry spans to the collector", "endpoint", tracing.Redacted(c.Endpoint), "sample_ratio", c.SampleRatio)
	return nil
}

// closeTracing sends the spans still queued, waiting at most 5 s for the
// collector; safe to call twice.
func (gw *Gateway) closeTracing() {
	if gw.tracer == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := gw.tracer.Shutdown(ctx); err != nil {
		gw.log.Warn("tracing: spans not sent to the collector at shutdown", "err", err)
	}
}
