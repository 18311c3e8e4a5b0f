package server_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// fakeEngine serves h as a replica of model "broken" (the harness's sim
// replicas serve another model, so every request below reaches only these).
func fakeEngine(t *testing.T, h *servertest.Gateway, id string, handler http.HandlerFunc) {
	t.Helper()
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	h.AddReplica(id, srv.URL, "broken")
}

// TestUpstreamFailuresMapToGatewayStatuses pins the error table's routed
// rows as a client sees them: the status, OpenAI's error shape with a
// string (or null) code, Retry-After where the engine asked for one, and
// the ledger row.
func TestUpstreamFailuresMapToGatewayStatuses(t *testing.T) {
	body := `{"model":"broken","messages":[{"role":"user","content":"hi"}]}`
	streamBody := `{"model":"broken","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name        string
		engine      http.HandlerFunc // nil: a replica whose port refuses connections
		body        string
		wantStatus  int
		wantCode    string // "" means null
		wantParam   string
		wantRetry   string
		wantOutcome data.Outcome
	}{
		{
			name: "replica answers 500: bad gateway",
			engine: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(500)
				io.WriteString(w, `{"error":{"message":"engine exploded","type":"InternalServerError","param":null,"code":500}}`)
			},
			body: body, wantStatus: 502, wantCode: "upstream_error", wantOutcome: data.OutcomeUpstreamError,
		},
		{
			name:   "connection refused on every replica: bad gateway",
			engine: nil,
			body:   body, wantStatus: 502, wantCode: "upstream_unreachable", wantOutcome: data.OutcomeUpstreamError,
		},
		{
			name: "no answer before the JSON deadline: gateway timeout",
			engine: func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-r.Context().Done():
				case <-time.After(5 * time.Second):
				}
			},
			body: body, wantStatus: 504, wantCode: "upstream_timeout", wantOutcome: data.OutcomeUpstreamError,
		},
		{
			name: "no first token before the TTFT deadline: gateway timeout",
			engine: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(200) // engines send 200 early
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
				case <-time.After(5 * time.Second):
				}
			},
			body: streamBody, wantStatus: 504, wantCode: "upstream_timeout", wantOutcome: data.OutcomeUpstreamError,
		},
		{
			name: "a JSON client's engine stream gives no first token: gateway timeout at the TTFT deadline",
			engine: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(200) // the gateway streams from the engine for JSON clients too
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
				case <-time.After(5 * time.Second):
				}
			},
			body: body, wantStatus: 504, wantCode: "upstream_timeout", wantOutcome: data.OutcomeUpstreamError,
		},
		{
			name: "engine 429 with Retry-After and no other replica: 429 with the engine's Retry-After",
			engine: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", "7")
				w.WriteHeader(429)
				io.WriteString(w, `{"error":{"message":"busy","type":"TooManyRequests","param":null,"code":429}}`)
			},
			body: body, wantStatus: 429, wantCode: "upstream_overloaded", wantRetry: "7", wantOutcome: data.OutcomeUpstreamError,
		},
		{
			name: "every replica draining: service unavailable",
			engine: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(503)
				io.WriteString(w, `{"error":{"message":"draining","type":"server_error","param":null,"code":"replica_draining"}}`)
			},
			body: body, wantStatus: 503, wantCode: "no_replica", wantRetry: "1", wantOutcome: data.OutcomeUpstreamError,
		},
		{
			name: "engine's own 400 in vLLM's shape: relayed as 400 with a null code",
			engine: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(400)
				io.WriteString(w, `{"error":{"message":"This model's maximum context length is 8 tokens","type":"BadRequestError","param":"max_tokens","code":400}}`)
			},
			body: body, wantStatus: 400, wantCode: "", wantParam: "max_tokens", wantOutcome: data.OutcomeUpstreamRejected,
		},
		{
			name: "engine's own 404 in vLLM's older top-level shape: relayed",
			engine: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(404)
				io.WriteString(w, `{"object":"error","message":"The model does not exist.","type":"NotFoundError","param":"model","code":404}`)
			},
			body: body, wantStatus: 404, wantCode: "", wantParam: "model", wantOutcome: data.OutcomeUpstreamRejected,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := servertest.Start(t, servertest.Options{Replicas: 1, Server: server.Config{JSONDeadline: 300 * time.Millisecond, TTFTDeadline: 300 * time.Millisecond}})
			if tc.engine == nil {
				dead := httptest.NewServer(http.NotFoundHandler())
				url := dead.URL
				dead.Close()
				h.AddReplica("dead", url, "broken")
			} else {
				fakeEngine(t, h, "fake", tc.engine)
			}
			secret := h.Key(policy.KeyOptions{})
			resp := h.Post("/v1/chat/completions", secret, tc.body)
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d, want %d; body %s", resp.StatusCode, tc.wantStatus, raw)
			}
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Param   any    `json:"param"`
					Code    any    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(raw, &e); err != nil || e.Error.Message == "" {
				t.Fatalf("not an OpenAI error body: %s", raw)
			}
			switch c := e.Error.Code.(type) {
			case nil:
				if tc.wantCode != "" {
					t.Fatalf("code null, want %q", tc.wantCode)
				}
			case string:
				if c != tc.wantCode {
					t.Fatalf("code %q, want %q", c, tc.wantCode)
				}
			default:
				t.Fatalf("code %v is a %T; OpenAI clients want a string or null: %s", c, c, raw)
			}
			if p, _ := e.Error.Param.(string); p != tc.wantParam {
				t.Fatalf("param %v, want %q", e.Error.Param, tc.wantParam)
			}
			if got := resp.Header.Get("Retry-After"); got != tc.wantRetry || (got != "" && resp.Header.Get("Retry-After-Ms") != got+"000") {
				t.Fatalf("Retry-After %q, want %q", got, tc.wantRetry)
			}
			rows := h.LedgerRows()
			if len(rows) != 1 || rows[0].Outcome != tc.wantOutcome || rows[0].Status != tc.wantStatus {
				t.Fatalf("ledger %+v, want one row %s/%d", rows, tc.wantOutcome, tc.wantStatus)
			}
		})
	}
}

// TestStreamFailsOnceAfterKeepAlives: a stream whose only attempt fails
// after keep-alive comments went out ends with one in-band error event, and
// nothing (no keep-alive) follows it. Run under -race: the keep-alive timer
// and the failure path share one writer.
func TestStreamFailsOnceAfterKeepAlives(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1, Server: server.Config{KeepAlive: 5 * time.Millisecond}})
	fakeEngine(t, h, "fake", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		time.Sleep(80 * time.Millisecond) // keep-alives go out meanwhile
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
		// ... and the engine dies before its first token.
	})
	secret := h.Key(policy.KeyOptions{})
	resp := h.Post("/v1/chat/completions", secret, `{"model":"broken","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: the stream was committed by keep-alives", resp.StatusCode)
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	var cur strings.Builder
	for sc.Scan() {
		if sc.Text() == "" {
			events = append(events, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteString(sc.Text())
	}
	if len(events) < 2 || !strings.HasPrefix(events[0], ": keep-alive") {
		t.Fatalf("want keep-alives before the failure, got %q", events)
	}
	last := events[len(events)-1]
	if !strings.HasPrefix(last, "data: ") || !strings.Contains(last, `"code":"upstream_error"`) {
		t.Fatalf("the stream must end with the error event, got last %q of %q", last, events)
	}
	var e struct {
		Error struct{ Message, Code string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(last, "data: ")), &e); err != nil || e.Error.Message == "" {
		t.Fatalf("error event is not JSON in OpenAI's shape: %q (%v)", last, err)
	}
	n := 0
	for _, ev := range events {
		if strings.HasPrefix(ev, "data: ") {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("want exactly one data event (the error), got %d: %q", n, events)
	}
	time.Sleep(30 * time.Millisecond) // a stray keep-alive timer would write now, racing the handler's end
	rows := h.LedgerRows()
	if len(rows) != 1 || rows[0].Outcome != data.OutcomeUpstreamError || rows[0].Error != data.ClassUpstreamError {
		t.Fatalf("ledger %+v", rows)
	}
}
