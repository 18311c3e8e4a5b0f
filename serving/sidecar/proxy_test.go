package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// carriesToken reports whether an SSE event is a token event as DESIGN
// defines the first token (generated output of any kind, or a finish
// reason), decoded independently of the sidecar's byte scan.
func carriesToken(t testing.TB, ev string) bool {
	t.Helper()
	data, ok := strings.CutPrefix(strings.TrimSuffix(ev, "\n\n"), "data: ")
	if !ok || data == "[DONE]" {
		return false
	}
	var chunk struct {
		Choices []struct {
			Text  string `json:"text"`
			Delta struct {
				Content          string `json:"content"`
				Reasoning        string `json:"reasoning"`
				ReasoningContent string `json:"reasoning_content"`
				Refusal          string `json:"refusal"`
				ToolCalls        []any  `json:"tool_calls"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(data), &chunk); err != nil {
		t.Fatalf("event %q: %v", ev, err)
	}
	for _, c := range chunk.Choices {
		d := c.Delta
		if c.Text != "" || d.Content != "" || d.Reasoning != "" || d.ReasoningContent != "" ||
			d.Refusal != "" || len(d.ToolCalls) > 0 || c.FinishReason != nil {
			return true
		}
	}
	return false
}

func TestAnswersAreRelayedByteForByte(t *testing.T) {
	const chat = `"messages":[{"role":"user","content":"hello"}],"max_tokens":6,"ignore_eos":true`
	tests := []struct {
		name   string
		engine sim.Config
		path   string
		body   string
	}{
		{"chat JSON", sim.Config{Model: "m"}, "/v1/chat/completions", `{"model":"m",` + chat + `}`},
		{"completion JSON", sim.Config{Model: "m"}, "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":4}`},
		{"chat stream, one write per token", sim.Config{Model: "m", TPOT: time.Millisecond},
			"/v1/chat/completions", `{"model":"m",` + chat + `,"stream":true,"stream_options":{"include_usage":true}}`},
		{"chat stream, tokens written together", sim.Config{Model: "m"},
			"/v1/chat/completions", `{"model":"m",` + chat + `,"stream":true}`},
		{"completion stream", sim.Config{Model: "m", TPOT: time.Millisecond},
			"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":5,"ignore_eos":true,"stream":true}`},
		{"engine error", sim.Config{Model: "m"}, "/v1/chat/completions", `{"model":"other",` + chat + `}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng := startEngine(t, tt.engine)
			_, sc := startSidecar(t, eng.srv.URL, nil)
			status, hdr, got := send(t, context.Background(), http.MethodPost, sc.URL+tt.path, tt.body, "X-Request-Id", "req-1")
			want := eng.lastAnswer(t)
			if want.header.Get("Authorization") != "" {
				t.Error("the engine saw the cluster token")
			}
			if want.header.Get("X-Request-Id") != "req-1" {
				t.Errorf("engine got X-Request-Id %q", want.header.Get("X-Request-Id"))
			}
			if hdr.Get(serving.HeaderSimQueue) != "" {
				t.Errorf("the simulator's %s header reached the client", serving.HeaderSimQueue)
			}

			switch {
			case status != http.StatusOK:
				if status != http.StatusNotFound || !bytes.Equal(got, want.body) {
					t.Errorf("engine error relayed as %d %s, engine said %s", status, got, want.body)
				}
				if hdr.Get(serving.HeaderEngineTTFT) != "" {
					t.Error("timing header on an error")
				}
			case strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream"):
				checkStream(t, got, want.body)
			default:
				if !bytes.Equal(got, want.body) {
					t.Errorf("relayed\n%s\nengine wrote\n%s", got, want.body)
				}
				for _, name := range []string{serving.HeaderEngineTTFT, serving.HeaderEngineQueue} {
					if v, err := strconv.ParseFloat(hdr.Get(name), 64); err != nil || v < 0 {
						t.Errorf("%s = %q", name, hdr.Get(name))
					}
				}
			}
		})
	}
}

// checkStream checks that got is the engine's stream want with its
// queue-time comment taken out and one timing comment put in right before
// the first token event.
func checkStream(t *testing.T, got, want []byte) {
	t.Helper()
	if bytes.Contains(got, []byte("sim-queue-ms")) {
		t.Errorf("the simulator's queue comment reached the client:\n%s", got)
	}
	var rest []string
	timingAt := -1
	for _, ev := range splitEvents(got) {
		vals, ok := timing(t, ev)
		if !ok {
			rest = append(rest, ev)
			continue
		}
		if timingAt >= 0 {
			t.Fatalf("second timing comment %q in:\n%s", ev, got)
		}
		timingAt = len(rest)
		if vals["engine_ttft_ms"] < 0 || len(vals) != 2 {
			t.Errorf("timing values %v, want engine_ttft_ms and engine_queue_ms ≥ 0", vals)
		}
		if q, ok := vals["engine_queue_ms"]; !ok || q < 0 {
			t.Errorf("engine_queue_ms = %v (present %v)", q, ok)
		}
	}
	if timingAt < 0 || timingAt >= len(rest) || !carriesToken(t, rest[timingAt]) {
		t.Fatalf("timing comment at event %d, not right before a token event:\n%s", timingAt, got)
	}
	for _, ev := range rest[:timingAt] {
		if carriesToken(t, ev) {
			t.Errorf("token event %q before the timing comment", ev)
		}
	}
	var engineEvents []string
	for _, ev := range splitEvents(want) {
		if !strings.HasPrefix(ev, ": sim-queue-ms=") {
			engineEvents = append(engineEvents, ev)
		}
	}
	if g, w := strings.Join(rest, ""), strings.Join(engineEvents, ""); g != w {
		t.Errorf("relayed events\n%s\nengine wrote\n%s", g, w)
	}
}

func TestModelsAreProxied(t *testing.T) {
	eng := startEngine(t, sim.Config{Model: "m"})
	_, sc := startSidecar(t, eng.srv.URL, nil)
	status, _, got := send(t, context.Background(), http.MethodGet, sc.URL+"/v1/models", "")
	if status != http.StatusOK || !bytes.Equal(got, eng.lastAnswer(t).body) {
		t.Errorf("GET /v1/models: %d %s", status, got)
	}
}

func TestQueueTimeFlowsThrough(t *testing.T) {
	eng := startEngine(t, sim.Config{Model: "m", MaxSeqs: 1, TPOT: time.Hour})
	s, sc := startSidecar(t, eng.srv.URL, nil)
	chat := sc.URL + "/v1/chat/completions"

	// The first request takes the only slot and keeps it.
	ctx, disconnect := context.WithCancel(context.Background())
	defer disconnect()
	resp := open(t, ctx, http.MethodPost, chat,
		`{"messages":[{"role":"user","content":"a"}],"max_tokens":2,"ignore_eos":true,"stream":true}`,
		"Authorization", "Bearer "+testToken)
	if resp == nil {
		t.FailNow()
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	readEvent(t, r) // role
	first, ok := timing(t, readEvent(t, r))
	if !ok || first["engine_queue_ms"] < 0 {
		t.Fatalf("first request's timing = %v", first)
	}

	// Two more wait behind it, a stream and a JSON request.
	var (
		wg         sync.WaitGroup
		streamBody []byte
		jsonHeader http.Header
	)
	wg.Go(func() {
		_, _, streamBody = send(t, context.Background(), http.MethodPost, chat,
			`{"messages":[{"role":"user","content":"b"}],"max_tokens":1,"stream":true}`)
	})
	wg.Go(func() {
		_, jsonHeader, _ = send(t, context.Background(), http.MethodPost, chat,
			`{"messages":[{"role":"user","content":"c"}],"max_tokens":1}`)
	})
	testkit.WaitFor(t, "two requests to queue", func() bool { return eng.Stats().Waiting == 2 })
	if n := s.Inflight(); n != 3 {
		t.Errorf("Inflight() = %d, want 3", n)
	}
	disconnect()
	wg.Wait()

	var streamTiming map[string]float64
	for _, ev := range splitEvents(streamBody) {
		if v, ok := timing(t, ev); ok {
			streamTiming = v
		}
	}
	if streamTiming["engine_queue_ms"] <= 0 || streamTiming["engine_ttft_ms"] <= 0 {
		t.Errorf("queued stream's timing = %v, want a queue time > 0", streamTiming)
	}
	if q, err := strconv.ParseFloat(jsonHeader.Get(serving.HeaderEngineQueue), 64); err != nil || q <= 0 {
		t.Errorf("queued JSON answer's %s = %q, want > 0", serving.HeaderEngineQueue, jsonHeader.Get(serving.HeaderEngineQueue))
	}
}

func TestClientDisconnectAbortsTheEngineRequest(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run("stream="+strconv.FormatBool(stream), func(t *testing.T) {
			eng := startEngine(t, sim.Config{Model: "m", TPOT: time.Hour})
			s, sc := startSidecar(t, eng.srv.URL, nil)
			ctx, disconnect := context.WithCancel(context.Background())
			defer disconnect()
			body := `{"messages":[{"role":"user","content":"a"}],"max_tokens":2,"ignore_eos":true,"stream":` + strconv.FormatBool(stream) + `}`
			done := make(chan struct{})
			go func() {
				defer close(done)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, sc.URL+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+testToken)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return
				}
				defer resp.Body.Close()
				r := bufio.NewReader(resp.Body)
				for {
					if _, err := r.ReadString('\n'); err != nil {
						return
					}
				}
			}()
			testkit.WaitFor(t, "the engine to run the request", func() bool { return eng.Stats().Running == 1 })
			disconnect()
			<-done
			testkit.WaitFor(t, "the engine to abort", func() bool { return eng.Stats().Aborted == 1 && eng.Stats().Running == 0 })
			testkit.WaitFor(t, "the sidecar to let go", func() bool { return s.Inflight() == 0 })
			if c := eng.Stats().Completed; c != 0 {
				t.Errorf("engine completed %d requests", c)
			}
		})
	}
}

func TestClusterTokenIsRequired(t *testing.T) {
	eng := startEngine(t, sim.Config{Model: "m"})
	_, sc := startSidecar(t, eng.srv.URL, nil)
	tests := []struct {
		name, auth string
		want       int
	}{
		{"no header", "", http.StatusUnauthorized},
		{"wrong token", "Bearer not-the-token", http.StatusUnauthorized},
		{"token as a prefix", "Bearer " + testToken + "x", http.StatusUnauthorized},
		{"other scheme", "Basic " + testToken, http.StatusUnauthorized},
		{"right token", "Bearer " + testToken, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, rq := range []struct{ method, path, body string }{
				{http.MethodPost, "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"max_tokens":1}`},
				{http.MethodPost, "/v1/completions", `{"prompt":"a","max_tokens":1}`},
				{http.MethodGet, "/v1/models", ""},
				{http.MethodGet, "/health", ""},
			} {
				before := eng.requests()
				var hdr []string
				if tt.auth != "" {
					hdr = []string{"Authorization", tt.auth}
				}
				resp := open(t, context.Background(), rq.method, sc.URL+rq.path, rq.body, hdr...)
				if resp == nil {
					continue
				}
				var e struct {
					Error struct{ Code, Type, Message string }
				}
				_ = json.NewDecoder(resp.Body).Decode(&e)
				resp.Body.Close()
				if resp.StatusCode != tt.want {
					t.Errorf("%s %s: status %d, want %d", rq.method, rq.path, resp.StatusCode, tt.want)
				}
				if tt.want == http.StatusUnauthorized {
					if e.Error.Code != "invalid_cluster_token" || e.Error.Type == "" || e.Error.Message == "" {
						t.Errorf("%s %s: error body %+v, want OpenAI's shape", rq.method, rq.path, e)
					}
					if eng.requests() != before {
						t.Errorf("%s %s reached the engine without the token", rq.method, rq.path)
					}
				}
			}
		})
	}
}

func TestDrainLetsInflightFinish(t *testing.T) {
	eng := startEngine(t, sim.Config{Model: "m", TPOT: time.Millisecond})
	s, sc := startSidecar(t, eng.srv.URL, nil)
	chat := sc.URL + "/v1/chat/completions"

	// A stream whose engine holds its second write until released.
	resp := open(t, context.Background(), http.MethodPost, chat,
		`{"messages":[{"role":"user","content":"a"}],"max_tokens":5,"ignore_eos":true,"stream":true}`,
		"Authorization", "Bearer "+testToken, "X-Test-Gate", "1")
	if resp == nil {
		t.FailNow()
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	readEvent(t, r) // role
	readEvent(t, r) // timing
	readEvent(t, r) // first token

	drained := make(chan error, 1)
	go func() { drained <- s.Drain(context.Background()) }()
	testkit.WaitFor(t, "the sidecar to drain", func() bool {
		status, _, _ := send(t, context.Background(), http.MethodGet, sc.URL+"/health", "")
		return status == http.StatusServiceUnavailable
	})

	status, hdr, body := send(t, context.Background(), http.MethodPost, chat, `{"messages":[{"role":"user","content":"b"}],"max_tokens":1}`)
	var e struct{ Error struct{ Code string } }
	_ = json.Unmarshal(body, &e)
	if status != http.StatusServiceUnavailable || e.Error.Code != "replica_draining" || hdr.Get("Retry-After") != "1" {
		t.Errorf("new request while draining: %d, Retry-After %q, %s", status, hdr.Get("Retry-After"), body)
	}
	_, _, health := send(t, context.Background(), http.MethodGet, sc.URL+"/health", "")
	if string(health) != `{"state":"draining"}` {
		t.Errorf("/health while draining: %s", health)
	}
	select {
	case err := <-drained:
		t.Fatalf("Drain returned %v with a stream in flight", err)
	default:
	}
	if n := s.Inflight(); n != 1 {
		t.Errorf("Inflight() = %d, want 1", n)
	}

	eng.release()
	var rest bytes.Buffer
	if _, err := rest.ReadFrom(r); err != nil {
		t.Fatalf("read the rest of the stream: %v", err)
	}
	if !bytes.HasSuffix(rest.Bytes(), []byte("data: [DONE]\n\n")) || strings.Count(rest.String(), `"content":"`) != 4 {
		t.Errorf("the in-flight stream did not finish:\n%s", rest.Bytes())
	}
	if err := <-drained; err != nil {
		t.Errorf("Drain = %v", err)
	}
	if n := s.Inflight(); n != 0 {
		t.Errorf("Inflight() = %d after Drain", n)
	}
}

func TestDrainGivesUpWithItsContext(t *testing.T) {
	eng := startEngine(t, sim.Config{Model: "m", TPOT: time.Hour})
	s, sc := startSidecar(t, eng.srv.URL, nil)
	ctx, disconnect := context.WithCancel(context.Background())
	defer disconnect()
	resp := open(t, ctx, http.MethodPost, sc.URL+"/v1/chat/completions",
		`{"messages":[{"role":"user","content":"a"}],"max_tokens":2,"ignore_eos":true,"stream":true}`,
		"Authorization", "Bearer "+testToken)
	if resp == nil {
		t.FailNow()
	}
	defer resp.Body.Close()
	testkit.WaitFor(t, "the request to run", func() bool { return eng.Stats().Running == 1 })

	dctx, cancel := context.WithCancel(context.Background())
	drained := make(chan error, 1)
	go func() { drained <- s.Drain(dctx) }()
	cancel()
	if err := <-drained; err != context.Canceled {
		t.Errorf("Drain = %v, want context.Canceled", err)
	}
	if n := s.Inflight(); n != 1 {
		t.Errorf("Inflight() = %d, want the stream still counted", n)
	}
}

func TestOnlyReadyServes(t *testing.T) {
	eng := startEngine(t, sim.Config{Model: "m"})
	s, sc := startSidecar(t, eng.srv.URL, nil)
	tests := []struct {
		state, reason string
		code          string // "" when served
		health        string
	}{
		{serving.StateStarting, "", "replica_not_ready", `{"state":"starting"}`},
		{serving.StateWarming, "loading weights", "replica_not_ready", `{"state":"warming","reason":"loading weights"}`},
		{serving.StateFailed, "engine exited 1", "replica_not_ready", `{"state":"failed","reason":"engine exited 1"}`},
		{serving.StateDraining, "", "replica_draining", `{"state":"draining"}`},
		{serving.StateReady, "", "", `{"state":"ready"}`},
	}
	for _, tt := range tests {
		t.Run(tt.state, func(t *testing.T) {
			s.SetState(tt.state, tt.reason)
			before := eng.requests()
			status, hdr, body := send(t, context.Background(), http.MethodPost, sc.URL+"/v1/chat/completions",
				`{"messages":[{"role":"user","content":"a"}],"max_tokens":1}`)
			hstatus, _, health := send(t, context.Background(), http.MethodGet, sc.URL+"/health", "")
			if string(health) != tt.health {
				t.Errorf("/health = %s, want %s", health, tt.health)
			}
			if tt.code == "" {
				if status != http.StatusOK || hstatus != http.StatusOK {
					t.Errorf("ready: request %d, health %d", status, hstatus)
				}
				return
			}
			var e struct {
				Error struct{ Code, Message string }
			}
			_ = json.Unmarshal(body, &e)
			if status != http.StatusServiceUnavailable || e.Error.Code != tt.code || hdr.Get("Retry-After") != "1" {
				t.Errorf("request: %d %s", status, body)
			}
			if tt.reason != "" && !strings.Contains(e.Error.Message, tt.reason) {
				t.Errorf("message %q does not say why", e.Error.Message)
			}
			if hstatus != http.StatusServiceUnavailable {
				t.Errorf("/health status %d", hstatus)
			}
			if eng.requests() != before {
				t.Error("the request reached the engine")
			}
		})
	}
}

func TestEngineDownIsUnavailable(t *testing.T) {
	eng := startEngine(t, sim.Config{})
	url := eng.srv.URL
	eng.srv.Close()
	_, sc := startSidecar(t, url, nil)
	status, hdr, body := send(t, context.Background(), http.MethodPost, sc.URL+"/v1/completions", `{"prompt":"a"}`)
	var e struct{ Error struct{ Code string } }
	_ = json.Unmarshal(body, &e)
	if status != http.StatusServiceUnavailable || e.Error.Code != "engine_unavailable" || hdr.Get("Retry-After") != "1" {
		t.Errorf("engine down: %d %s", status, body)
	}
}
