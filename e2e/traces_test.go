package e2e

import (
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpSpan is a span as a loopback OTLP/HTTP receiver got it.
type otlpSpan struct {
	service string
	*tracepb.Span
}

// otlpReceiver collects the spans posted to it over OTLP/HTTP (protobuf).
type otlpReceiver struct {
	mu    sync.Mutex
	spans []otlpSpan
}

func startOTLPReceiver(t *testing.T) (*otlpReceiver, string) {
	rc := &otlpReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(raw, &req) != nil {
			http.Error(w, "want an OTLP/HTTP protobuf export at /v1/traces", http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		defer rc.mu.Unlock()
		for _, rs := range req.ResourceSpans {
			service := ""
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					service = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					rc.spans = append(rc.spans, otlpSpan{service, s})
				}
			}
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(srv.Close)
	return rc, srv.URL
}

// inTrace returns the spans of the trace with the given hex id.
func (rc *otlpReceiver) inTrace(id string) []otlpSpan {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []otlpSpan
	for _, s := range rc.spans {
		if hex.EncodeToString(s.TraceId) == id {
			out = append(out, s)
		}
	}
	return out
}

// TestUpExportsOneTraceFromClientToSidecar: `up --otlp-endpoint` sends the
// gateway's and its workers' spans to the collector; one request's trace
// goes from the client's traceparent (loopback is trusted with it,
// --trust-trace-from) through the gateway's request and attempt spans to
// the worker's sidecar span, the attempt's child.
func TestUpExportsOneTraceFromClientToSidecar(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	rc, collector := startOTLPReceiver(t)
	p := startUp(t, "--replicas", "1", "--sim-ttft", "5ms", "--sim-tpot", "1ms", "--otlp-endpoint", collector, "--trust-trace-from", "127.0.0.0/8")

	const traceID = "0af7651916cd43dd8448eb211c80319c"
	req, _ := http.NewRequest(http.MethodPost, p.api+"/chat/completions", strings.NewReader(
		`{"model":"tailgate-sim","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"Say hello"}]}`))
	req.Header.Set("Authorization", "Bearer "+p.demoKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", "00-"+traceID+"-b7ad6b7169203331-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}

	// Spans go out in batches (every 5 s by default).
	var chat, attempt, sidecar *otlpSpan
	deadline := time.Now().Add(20 * time.Second)
	for chat == nil || attempt == nil || sidecar == nil {
		if time.Now().After(deadline) {
			t.Fatalf("trace incomplete after 20s: request %v, attempt %v, sidecar %v; spans: %v", chat != nil, attempt != nil, sidecar != nil, rc.inTrace(traceID))
		}
		time.Sleep(100 * time.Millisecond)
		for _, s := range rc.inTrace(traceID) {
			switch {
			case s.service == "tailgate-gateway" && s.Name == "chat tailgate-sim":
				chat = &s
			case s.service == "tailgate-gateway" && s.Name == "attempt first":
				attempt = &s
			case s.service == "tailgate-worker" && s.Name == "sidecar /v1/chat/completions":
				sidecar = &s
			}
		}
	}
	if got := hex.EncodeToString(chat.ParentSpanId); got != "b7ad6b7169203331" {
		t.Errorf("request span's parent %s, want the client's span", got)
	}
	if string(attempt.ParentSpanId) != string(chat.SpanId) {
		t.Error("the attempt span is not the request span's child")
	}
	if string(sidecar.ParentSpanId) != string(attempt.SpanId) {
		t.Error("the sidecar's span is not the gateway attempt's child: traceparent did not reach the worker")
	}
}
