package sidecar

import (
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/tailgate-dev/tailgate/serving/tracing"
)

// Traces: a generation request gets a span of the sidecar's, a child of the
// gateway's attempt (its traceparent), and the engine gets the sidecar's
// span as its traceparent (vLLM continues it with --otlp-traces-endpoint).
// Its attributes are the engine's share of the request (engine_ttft,
// engine_queue) and the engine's status; never the body. With tracing off
// (no Config.Tracer) nothing here runs but a nil check, and the gateway's
// traceparent passes to the engine untouched with the other headers.

// traced starts the span of a generation request and returns r carrying it;
// r as it is, and a nil span, when tracing is off.
func (s *Sidecar) traced(r *http.Request) (*http.Request, trace.Span) {
	if s.tracer == nil {
		return r, nil
	}
	ctx, span := s.tracer.Start(tracing.Extract(r.Context(), r.Header), "sidecar "+r.URL.Path,
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			attribute.String("http.request.method", r.Method),
			attribute.String("url.path", r.URL.Path),
			attribute.String("tailgate.request_id", r.Header.Get("X-Request-Id")),
		))
	return r.WithContext(ctx), span
}

// answered records the engine's answer (or that there was none) on span.
func answered(span trace.Span, resp *http.Response, err error) {
	switch {
	case span == nil:
	case err != nil:
		span.SetStatus(codes.Error, "engine request failed")
	default:
		span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
		if resp.StatusCode >= 500 {
			span.SetStatus(codes.Error, http.StatusText(resp.StatusCode))
		}
	}
}

// refused records why the sidecar answered a request itself.
func refused(span trace.Span, aerr *apiError) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.Int("http.response.status_code", aerr.status), attribute.String("error.type", aerr.code))
	span.SetStatus(codes.Error, aerr.code)
}

// traceTTFT records the engine's share of the request on r's span, if any.
func traceTTFT(r *http.Request, ttft, queue time.Duration, haveQueue bool) {
	span := trace.SpanFromContext(r.Context())
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.Float64("tailgate.stage.engine_ttft_ms", millis(ttft)))
	if haveQueue {
		span.SetAttributes(attribute.Float64("tailgate.stage.engine_queue_ms", millis(queue)))
	}
}

func endSpan(span trace.Span) {
	if span != nil {
		span.End()
	}
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
