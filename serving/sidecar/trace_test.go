package sidecar

import (
	"context"
	"net/http"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tailgate-dev/tailgate/serving/sim"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

const (
	gwTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	gwSpan   = "00f067aa0ba902b7"
	gwParent = "00-" + gwTrace + "-" + gwSpan + "-01"
)

// TestSidecarSpanContinuesTheGatewaysTrace: with a tracer, a generation
// request's span is a child of the gateway attempt's traceparent, holds the
// engine's time to first token, and is the parent the engine gets; a JSON
// answer and a stream alike.
func TestSidecarSpanContinuesTheGatewaysTrace(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "stream"}[stream], func(t *testing.T) {
			exp := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			eng := startEngine(t, sim.Config{TTFT: time.Millisecond, TTFTSigma: -1})
			_, sc := startSidecar(t, eng.srv.URL, func(c *Config) { c.Tracer = tp })

			body := `{"model":"tailgate-sim","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
			if stream {
				body = `{"model":"tailgate-sim","max_tokens":2,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
			}
			status, _, _ := send(t, context.Background(), http.MethodPost, sc.URL+"/v1/chat/completions", body,
				"Traceparent", gwParent, "X-Request-Id", "req-7")
			if status != http.StatusOK {
				t.Fatalf("status %d", status)
			}
			testkit.WaitFor(t, "the sidecar's span", func() bool { return len(exp.GetSpans()) > 0 })
			spans := exp.GetSpans()
			if len(spans) != 1 {
				t.Fatalf("%d spans, want 1: %v", len(spans), spans)
			}
			s := spans[0]
			if s.Name != "sidecar /v1/chat/completions" || s.SpanKind != trace.SpanKindServer {
				t.Errorf("span %q kind %v", s.Name, s.SpanKind)
			}
			if s.SpanContext.TraceID().String() != gwTrace || s.Parent.SpanID().String() != gwSpan {
				t.Errorf("span in trace %s under %s, want the gateway's %s under %s", s.SpanContext.TraceID(), s.Parent.SpanID(), gwTrace, gwSpan)
			}
			attrs := map[string]string{}
			for _, kv := range s.Attributes {
				attrs[string(kv.Key)] = kv.Value.Emit()
			}
			if attrs["tailgate.request_id"] != "req-7" || attrs["http.response.status_code"] != "200" || attrs["tailgate.stage.engine_ttft_ms"] == "" {
				t.Errorf("span attributes %v: want the request id, status 200 and engine_ttft", attrs)
			}
			want := "00-" + gwTrace + "-" + s.SpanContext.SpanID().String() + "-01"
			if got := eng.lastAnswer(t).header.Get("Traceparent"); got != want {
				t.Errorf("the engine got traceparent %q, want the sidecar's span %q", got, want)
			}
		})
	}
}

// TestSidecarWithoutTracerPassesTraceparentOn: with tracing off the
// sidecar makes no span of its own, and the engine continues the
// gateway's.
func TestSidecarWithoutTracerPassesTraceparentOn(t *testing.T) {
	eng := startEngine(t, sim.Config{TTFT: time.Millisecond, TTFTSigma: -1})
	_, sc := startSidecar(t, eng.srv.URL, nil)
	status, _, _ := send(t, context.Background(), http.MethodPost, sc.URL+"/v1/chat/completions",
		`{"model":"tailgate-sim","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, "Traceparent", gwParent)
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	if got := eng.lastAnswer(t).header.Get("Traceparent"); got != gwParent {
		t.Errorf("the engine got traceparent %q, want the gateway's %q", got, gwParent)
	}
}
