// Package tracing sets up OpenTelemetry traces for a tailgate role: spans
// exported over OTLP/HTTP to a collector (an OpenTelemetry Collector,
// Jaeger's OTLP port, …), sampled by a parent-based ratio sampler, with W3C
// trace context (traceparent) carried between gateway, sidecar and engine.
// With no endpoint it makes nothing: no provider, no goroutine, no export.
//
// It owns no global state: a role passes the provider [New] returns to the
// parts that make spans (server.Deps.Tracer, sidecar.Config.Tracer).
package tracing

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Config says where spans go and how many.
type Config struct {
	// Endpoint is the collector's OTLP/HTTP URL (--otlp-endpoint), e.g.
	// http://127.0.0.1:4318: a URL without a path gets OTLP's /v1/traces,
	// one with a path is used as given. "" turns tracing off.
	Endpoint string
	// SampleRatio is the share of new traces recorded (--otlp-sample-ratio),
	// in [0, 1]. A request continues its client's trace, and follows the
	// client's sampling decision, only where the role trusts the client
	// to (the gateway: --trust-trace-from; the sidecar: its gateway);
	// every other request is a new trace. The flags' default is 1 (every
	// request); 0 records only the traces trusted clients asked for.
	SampleRatio float64
	// Service is the service.name of the spans ("tailgate-gateway",
	// "tailgate-worker"); OTEL_SERVICE_NAME, when set, wins.
	Service string
}

// RegisterFlags defines --otlp-endpoint and --otlp-sample-ratio on fs, the
// same on every role that makes spans.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Endpoint, "otlp-endpoint", "", "send OpenTelemetry traces to this collector's OTLP/HTTP URL, e.g. http://127.0.0.1:4318 (/v1/traces is added to a URL without a path); empty: no traces")
	fs.Float64Var(&c.SampleRatio, "otlp-sample-ratio", 1, "share of requests traced, between 0 and 1; a request whose client is trusted with its trace context (the gateway's --trust-trace-from) and sent a traceparent is traced as that says")
}

// Args returns the flags that give another tailgate process (a worker
// that `up` starts) the same settings; none when tracing is off.
func (c Config) Args() []string {
	if c.Endpoint == "" {
		return nil
	}
	return []string{"--otlp-endpoint", c.Endpoint, "--otlp-sample-ratio", strconv.FormatFloat(c.SampleRatio, 'g', -1, 64)}
}

// Validate reports whether c is usable, naming the flag at fault.
func (c Config) Validate() error {
	if !(c.SampleRatio >= 0 && c.SampleRatio <= 1) {
		return fmt.Errorf("--otlp-sample-ratio %v: want a share between 0 and 1", c.SampleRatio)
	}
	if c.Endpoint == "" {
		return nil
	}
	if _, err := TracesURL(c.Endpoint); err != nil {
		return err
	}
	return nil
}

// TracesURL returns the OTLP/HTTP traces URL of an --otlp-endpoint: the URL
// as given when it has a path, else with /v1/traces.
func TracesURL(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("--otlp-endpoint %q: want the collector's OTLP/HTTP URL, e.g. http://127.0.0.1:4318", endpoint)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	return u.String(), nil
}

// Redacted is an endpoint as a log line may show it: without a password.
func Redacted(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil {
		return ""
	}
	return u.Redacted()
}

// New returns a tracer provider exporting to c.Endpoint in batches, or nil
// when c.Endpoint is "" (tracing off). The caller shuts it down, which
// sends what is still queued.
func New(c Config) (*sdktrace.TracerProvider, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Endpoint == "" {
		return nil, nil
	}
	traces, _ := TracesURL(c.Endpoint)
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(traces))
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	service := c.Service
	if service == "" {
		service = "tailgate"
	}
	res, err := resource.New(context.Background(),
		resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SampleRatio))),
	), nil
}

// Extract returns ctx with the remote span context of h's W3C traceparent
// (and tracestate), if it carries a valid one.
func Extract(ctx context.Context, h http.Header) context.Context {
	return propagation.TraceContext{}.Extract(ctx, propagation.HeaderCarrier(h))
}

// ExtractParent returns ctx with the remote span context of h's W3C
// traceparent alone, if it carries a valid one: its tracestate (a list
// of vendors' values, up to 32 of them) is dropped, so nothing a client
// wrote rides on to the spans' children and the engine. Baggage is never
// read. For requests from outside the deployment.
func ExtractParent(ctx context.Context, h http.Header) context.Context {
	sc := trace.SpanContextFromContext(Extract(ctx, h))
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc.WithTraceState(trace.TraceState{}))
}

// Inject sets h's traceparent (and tracestate) to ctx's span, the W3C
// headers vLLM reads too; it removes any h had when ctx has none, so a
// stale one never passes on.
func Inject(ctx context.Context, h http.Header) {
	h.Del("Traceparent")
	h.Del("Tracestate")
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(h))
}
