package server_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// A client's trace as it sends it: trace id and its own span's id.
const (
	clientTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpanID  = "00f067aa0ba902b7"
	clientParent  = "00-" + clientTraceID + "-" + clientSpanID + "-01"
	tracedPrompt  = "the secret plan is purple elephants"
)

// traceparents records the traceparent header of every generation request
// an engine gets.
type traceparents struct {
	mu   sync.Mutex
	seen []string
}

func (tp *traceparents) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			tp.mu.Lock()
			tp.seen = append(tp.seen, r.Header.Get("Traceparent"))
			tp.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})
}

func (tp *traceparents) last() string {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if len(tp.seen) == 0 {
		return ""
	}
	return tp.seen[len(tp.seen)-1]
}

// tracedFleet starts simulated engines per cfgs whose servers record the
// traceparent they get.
func tracedFleet(t *testing.T, cfgs ...sim.Config) ([]servertest.Sim, []*traceparents) {
	var fleet []servertest.Sim
	var seen []*traceparents
	for i, c := range cfgs {
		c.Seed = int64(i + 1)
		eng, err := sim.New(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		tp := &traceparents{}
		srv := httptest.NewUnstartedServer(nil)
		srv.Config = eng.NewServer(nil)
		srv.Config.Handler = tp.wrap(srv.Config.Handler)
		srv.Start()
		t.Cleanup(srv.Close)
		fleet = append(fleet, servertest.Sim{Engine: eng, Server: srv})
		seen = append(seen, tp)
	}
	return fleet, seen
}

// postTraced sends a chat request carrying the client's traceparent.
func postTraced(t *testing.T, h *servertest.Gateway, secret, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.Public.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+secret)
	req.Header.Set("Traceparent", clientParent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// requestSpan waits (bounded) for the span of the request with the given
// x-request-id: it ends when the handler returns, just after the client has
// its answer.
func requestSpan(t *testing.T, exp *tracetest.InMemoryExporter, id string) tracetest.SpanStub {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, s := range exp.GetSpans() {
			if attr(s, "tailgate.request_id").AsString() == id {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no span for request %s; spans: %v", id, spanNames(exp.GetSpans()))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func attr(s tracetest.SpanStub, key string) attribute.Value {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func spanNames(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

// TestTraceOfAHedgedRequest follows one hedged request: the client's trace
// goes on in the gateway's request span ("chat MODEL" with the GenAI
// attributes and the stage timings), whose children are the admission, the
// first attempt (lost) on the slow replica, the hedge (won) on the fast one
// and the ledger commit; each engine got the traceparent of its own
// attempt's span; no attribute holds the prompt or the key.
func TestTraceOfAHedgedRequest(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	fleet, seen := tracedFleet(t,
		sim.Config{TTFT: time.Second, TTFTSigma: -1},
		sim.Config{TTFT: 5 * time.Millisecond, TTFTSigma: -1})
	h := servertest.Start(t, servertest.Options{
		Fleet:  fleet,
		Tracer: tp,
		// The client (loopback) is trusted to continue its own trace.
		Server: server.Config{TraceFrom: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}},
		Router: router.Config{
			Rand:  func(int) int { return 0 }, // the slow fleet-0 is tried first
			Hedge: router.HedgeConfig{Enabled: true, MinSamples: 5, Min: time.Millisecond},
		},
	})
	secret := h.Key(policy.KeyOptions{})
	slow := h.Reg.Get("fleet-0")
	h.LearnWithout(slow, 8, func() {
		resp := h.Post("/v1/chat/completions", secret, `{"model":"tailgate-sim","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	})
	if _, ok := h.Reg.HedgeDelay(servertest.SimModel, true); !ok {
		t.Fatal("no hedge delay learnt")
	}

	resp := postTraced(t, h, secret, `{"model":"tailgate-sim","max_tokens":4,"temperature":0.5,"top_p":0.9,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"`+tracedPrompt+`"}]}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Tailgate-Winner") != "hedge" {
		t.Fatalf("status %d, winner %q: the request was not won by a hedge", resp.StatusCode, resp.Header.Get("X-Tailgate-Winner"))
	}
	root := requestSpan(t, exp, resp.Header.Get("X-Request-Id"))

	// The request span continues the client's trace.
	if root.Name != "chat tailgate-sim" || root.SpanKind != trace.SpanKindServer {
		t.Errorf("request span %q kind %v, want \"chat tailgate-sim\" server", root.Name, root.SpanKind)
	}
	if root.SpanContext.TraceID().String() != clientTraceID || root.Parent.SpanID().String() != clientSpanID || !root.Parent.IsRemote() {
		t.Errorf("request span in trace %s under %s, want the client's %s under %s",
			root.SpanContext.TraceID(), root.Parent.SpanID(), clientTraceID, clientSpanID)
	}
	for key, want := range map[string]string{
		"gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm",
		"gen_ai.request.model": "tailgate-sim", "gen_ai.response.model": "tailgate-sim",
		"tailgate.winner": "hedge", "tailgate.replica": "fleet-1", "tailgate.outcome": "ok",
	} {
		if got := attr(root, key).Emit(); got != want {
			t.Errorf("request span %s = %q, want %q", key, got, want)
		}
	}
	if attr(root, "http.response.status_code").AsInt64() != 200 || !attr(root, "tailgate.hedged").AsBool() {
		t.Errorf("request span status %v hedged %v", attr(root, "http.response.status_code").Emit(), attr(root, "tailgate.hedged").Emit())
	}
	if attr(root, "gen_ai.request.max_tokens").AsInt64() != 4 || attr(root, "gen_ai.request.temperature").AsFloat64() != 0.5 || attr(root, "gen_ai.request.top_p").AsFloat64() != 0.9 {
		t.Errorf("request parameters max_tokens %s temperature %s top_p %s, want the 4, 0.5 and 0.9 sent",
			attr(root, "gen_ai.request.max_tokens").Emit(), attr(root, "gen_ai.request.temperature").Emit(), attr(root, "gen_ai.request.top_p").Emit())
	}
	if attr(root, "gen_ai.usage.input_tokens").AsInt64() <= 0 || attr(root, "gen_ai.usage.output_tokens").AsInt64() != 4 {
		t.Errorf("usage %s in / %s out, want some prompt and the 4 tokens asked for",
			attr(root, "gen_ai.usage.input_tokens").Emit(), attr(root, "gen_ai.usage.output_tokens").Emit())
	}
	for _, stage := range []string{"gateway", "connect", "upstream_ttft", "ttft", "total"} {
		if v := attr(root, "tailgate.stage."+stage+"_ms"); v.Type() != attribute.FLOAT64 || v.AsFloat64() < 0 {
			t.Errorf("request span has no stage %s (%v)", stage, v.Emit())
		}
	}

	// Its children: admission, both attempts, the ledger commit.
	children := map[string]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		if s.Parent.SpanID() == root.SpanContext.SpanID() {
			if _, dup := children[s.Name]; dup {
				t.Errorf("two child spans named %q", s.Name)
			}
			children[s.Name] = s
		}
	}
	for _, name := range []string{"admission", "attempt first", "attempt hedge", "ledger commit"} {
		if _, ok := children[name]; !ok {
			t.Errorf("no child span %q under the request; children: %v", name, spanNames(childList(children)))
		}
	}
	if len(children) != 4 {
		t.Errorf("request span has %d children %v, want 4", len(children), spanNames(childList(children)))
	}
	if got := attr(children["admission"], "tailgate.admission").Emit(); got != "admitted" {
		t.Errorf("admission span says %q", got)
	}
	first, hedge := children["attempt first"], children["attempt hedge"]
	for _, c := range []struct {
		span             tracetest.SpanStub
		replica, outcome string
		engine           *traceparents
	}{{first, "fleet-0", "lost", seen[0]}, {hedge, "fleet-1", "won", seen[1]}} {
		if got := attr(c.span, "tailgate.replica").Emit(); got != c.replica {
			t.Errorf("%s went to %q, want %s", c.span.Name, got, c.replica)
		}
		if got := attr(c.span, "tailgate.attempt.outcome").Emit(); got != c.outcome {
			t.Errorf("%s outcome %q, want %s", c.span.Name, got, c.outcome)
		}
		if c.span.SpanKind != trace.SpanKindClient {
			t.Errorf("%s kind %v, want client", c.span.Name, c.span.SpanKind)
		}
		// The engine's request continues this attempt's span.
		want := "00-" + clientTraceID + "-" + c.span.SpanContext.SpanID().String() + "-01"
		if got := c.engine.last(); got != want {
			t.Errorf("%s: the engine got traceparent %q, want %q", c.span.Name, got, want)
		}
	}
	if !hedge.StartTime.After(first.StartTime) {
		t.Error("the hedge span does not start after the first attempt's")
	}

	// Nothing of the prompt or the key in any span.
	for _, s := range exp.GetSpans() {
		for _, kv := range s.Attributes {
			v := kv.Value.Emit()
			if strings.Contains(v, "purple") || strings.Contains(v, secret) || strings.Contains(v, secret[:12]) {
				t.Errorf("span %q attribute %s = %q holds the prompt or the key", s.Name, kv.Key, v)
			}
		}
	}
}

func childList(m map[string]tracetest.SpanStub) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range m {
		out = append(out, s)
	}
	return out
}

// TestNoTracesWithoutATracer: with tracing off the client's traceparent
// goes no further than the gateway, and nothing is recorded.
func TestNoTracesWithoutATracer(t *testing.T) {
	fleet, seen := tracedFleet(t, sim.Config{TTFT: time.Millisecond, TTFTSigma: -1})
	h := servertest.Start(t, servertest.Options{Fleet: fleet})
	secret := h.Key(policy.KeyOptions{})
	resp := postTraced(t, h, secret, `{"model":"tailgate-sim","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := seen[0].last(); got != "" {
		t.Errorf("tracing off, yet the engine got traceparent %q", got)
	}
}

// TestSpansSayHowEachAnswerEnded: the request span carries the response id
// the client got and the finish reasons it was told
// (gen_ai.response.id, gen_ai.response.finish_reasons), on every way an
// answer reaches it — streamed, assembled into JSON, relayed whole — in
// chat's, Messages' and Responses' own words.
func TestSpansSayHowEachAnswerEnded(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	h := servertest.Start(t, servertest.Options{Replicas: 1, Tracer: tp, Sim: sim.Config{TTFT: time.Millisecond, TTFTSigma: -1}})
	secret := h.Key(policy.KeyOptions{})
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name, path, body string
		id               string // where the client reads the id: a JSON path, in the body or in a stream's events
		finish           string
	}{
		{"chat stream", "/v1/chat/completions", `{"model":"tailgate-sim","max_tokens":3,"stream":true,` + msgs + `}`, "id", "length"},
		{"chat json", "/v1/chat/completions", `{"model":"tailgate-sim","max_tokens":3,` + msgs + `}`, "id", "length"},
		{"completions stream", "/v1/completions", `{"model":"tailgate-sim","max_tokens":3,"stream":true,"prompt":"hi"}`, "id", "length"},
		{"messages stream", "/v1/messages", `{"model":"tailgate-sim","max_tokens":3,"stream":true,` + msgs + `}`, "message.id", "max_tokens"},
		{"messages json", "/v1/messages", `{"model":"tailgate-sim","max_tokens":3,` + msgs + `}`, "id", "max_tokens"},
		{"responses stream", "/v1/responses", `{"model":"tailgate-sim","max_output_tokens":3,"stream":true,"input":"hi"}`, "response.id", "max_output_tokens"},
		{"responses json", "/v1/responses", `{"model":"tailgate-sim","max_output_tokens":3,"input":"hi"}`, "id", "max_output_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.Post(tc.path, secret, tc.body)
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, raw)
			}
			// The id as the client read it: the body's, or the first event's that has one.
			id := gjson.GetBytes(raw, tc.id).Str
			for _, line := range strings.Split(string(raw), "\n") {
				if p, ok := strings.CutPrefix(line, "data: "); ok && id == "" {
					id = gjson.Get(p, tc.id).Str
				}
			}
			if id == "" {
				t.Fatalf("the client got no id at %s in %s", tc.id, raw)
			}
			span := requestSpan(t, exp, resp.Header.Get("X-Request-Id"))
			if got := attr(span, "gen_ai.response.id").AsString(); got != id {
				t.Errorf("gen_ai.response.id %q, want the client's %q", got, id)
			}
			if got := attr(span, "gen_ai.response.finish_reasons").AsStringSlice(); len(got) != 1 || got[0] != tc.finish {
				t.Errorf("gen_ai.response.finish_reasons %q, want [%s]", got, tc.finish)
			}
			if !strings.Contains(string(raw), tc.finish) {
				t.Errorf("the client was not told %q: %s", tc.finish, raw)
			}
		})
	}
}
