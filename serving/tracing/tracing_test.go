package tracing

import (
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// collector is an OTLP/HTTP traces receiver on loopback: it decodes what
// the exporter posts to /v1/traces.
type collector struct {
	mu       sync.Mutex
	paths    []string
	services []string
	spans    []*tracepb.Span
}

func startCollector(t *testing.T) (*collector, *httptest.Server) {
	c := &collector{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		raw, err := io.ReadAll(body)
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(raw, &req)
		}
		if err != nil || r.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("collector: %s %s: %v", r.Header.Get("Content-Type"), r.URL.Path, err)
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.paths = append(c.paths, r.URL.Path)
		for _, rs := range req.ResourceSpans {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					c.services = append(c.services, kv.GetValue().GetStringValue())
				}
			}
			for _, ss := range rs.ScopeSpans {
				c.spans = append(c.spans, ss.Spans...)
			}
		}
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(nil)
	}))
	t.Cleanup(srv.Close)
	return c, srv
}

// TestExportsOverOTLPHTTP: spans reach a collector at --otlp-endpoint (the
// OTLP path added to a bare URL) with the role's service name, once the
// provider is shut down.
func TestExportsOverOTLPHTTP(t *testing.T) {
	c, srv := startCollector(t)
	tp, err := New(Config{Endpoint: srv.URL, SampleRatio: 1, Service: "tailgate-gateway"})
	if err != nil || tp == nil {
		t.Fatalf("New: %v, %v", tp, err)
	}
	_, span := tp.Tracer("test").Start(context.Background(), "chat tailgate-sim")
	span.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.spans) != 1 || c.spans[0].Name != "chat tailgate-sim" {
		t.Fatalf("collector got %v", c.spans)
	}
	if c.paths[0] != "/v1/traces" || c.services[0] != "tailgate-gateway" {
		t.Errorf("posted to %s as service %q, want /v1/traces as tailgate-gateway", c.paths[0], c.services[0])
	}
}

// TestSampleRatioZeroFollowsTheClient: at ratio 0 no new trace is recorded,
// but one a client's traceparent marks sampled is.
func TestSampleRatioZeroFollowsTheClient(t *testing.T) {
	c, srv := startCollector(t)
	tp, err := New(Config{Endpoint: srv.URL + "/custom/path", SampleRatio: 0})
	if err != nil {
		t.Fatal(err)
	}
	_, own := tp.Tracer("test").Start(context.Background(), "unsampled")
	own.End()
	h := http.Header{}
	h.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	_, child := tp.Tracer("test").Start(Extract(context.Background(), h), "sampled by the client")
	child.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.spans) != 1 || c.spans[0].Name != "sampled by the client" || c.paths[0] != "/custom/path" {
		t.Fatalf("collector got %d spans at %v: %v", len(c.spans), c.paths, c.spans)
	}
}

func TestConfigErrorsNameTheFlag(t *testing.T) {
	for _, c := range []Config{
		{Endpoint: "collector:4318", SampleRatio: 1},
		{Endpoint: "http://127.0.0.1:4318", SampleRatio: 1.5},
		{SampleRatio: -0.1},
	} {
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), "--otlp-") {
			t.Errorf("%+v: %v, want an error naming the flag", c, err)
		}
	}
	if tp, err := New(Config{SampleRatio: 1}); tp != nil || err != nil {
		t.Errorf("no endpoint: %v, %v; want no provider", tp, err)
	}
}
