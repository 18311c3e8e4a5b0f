package sidecar

import (
	"bufio"
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/serving"
)

// scriptedEngine streams SSE parts as an engine would: the first at once,
// each later one when the test releases it.
type scriptedEngine struct {
	srv     *httptest.Server
	release chan struct{}
}

func startScriptedEngine(t *testing.T, parts ...string) *scriptedEngine {
	t.Helper()
	e := &scriptedEngine{release: make(chan struct{})}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		for i, part := range parts {
			if i > 0 {
				select {
				case <-e.release:
				case <-r.Context().Done():
					return
				}
			}
			if _, err := w.Write([]byte(part)); err != nil {
				return
			}
			_ = rc.Flush()
		}
	}))
	t.Cleanup(e.srv.Close)
	return e
}

const chunkHead = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1760000000,"model":"m",`

// TestEngineTTFTIsTakenAtTheFirstOutputOfAnyKind pins DESIGN's first token
// at the sidecar: a reasoning model's engine_ttft is the time to its first
// reasoning delta, not to the content after its reasoning; the same for a
// tool call, a refusal and an answer that ends at once. The engine holds
// everything after the first output until the test has read the timing
// comment, so the comment cannot have waited for it.
func TestEngineTTFTIsTakenAtTheFirstOutputOfAnyKind(t *testing.T) {
	const (
		role    = chunkHead + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}` + "\n\n"
		content = chunkHead + `"choices":[{"index":0,"delta":{"content":"Paris"},"logprobs":null,"finish_reason":null,"token_ids":null}]}` + "\n\n"
		end     = chunkHead + `"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null}]}` + "\n\n" +
			"data: [DONE]\n\n"
	)
	tests := []struct {
		name  string
		first string // the first event with output
	}{
		{"reasoning (vLLM 0.12 and later)",
			chunkHead + `"choices":[{"index":0,"delta":{"reasoning":"We"},"logprobs":null,"finish_reason":null,"token_ids":null}]}` + "\n\n"},
		{"reasoning_content (vLLM 0.11 and earlier)",
			chunkHead + `"choices":[{"index":0,"delta":{"reasoning_content":"We"},"logprobs":null,"finish_reason":null}]}` + "\n\n"},
		{"tool call",
			chunkHead + `"choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","index":0,"function":{"name":"get_weather"}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}` + "\n\n"},
		{"refusal",
			chunkHead + `"choices":[{"index":0,"delta":{"refusal":"I can't"},"logprobs":null,"finish_reason":null}]}` + "\n\n"},
		{"an answer that ends at once",
			chunkHead + `"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null}]}` + "\n\n"},
		{"content", content},
	}
	const hold = 30 * time.Millisecond
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng := startScriptedEngine(t, role, tt.first, content+end)
			s, sc := startSidecar(t, eng.srv.URL, nil)
			resp := open(t, context.Background(), http.MethodPost, sc.URL+"/v1/chat/completions",
				`{"messages":[{"role":"user","content":"a"}],"stream":true}`, "Authorization", "Bearer "+testToken)
			if resp == nil {
				t.FailNow()
			}
			defer resp.Body.Close()
			r := bufio.NewReader(resp.Body)
			if ev := readEvent(t, r); ev != role {
				t.Fatalf("first event %q, want the role chunk", ev)
			}

			// The engine sent its request's role chunk: it has the request.
			// Whatever it sends after hold came at least hold after the
			// request was written to it.
			time.Sleep(hold)
			eng.release <- struct{}{}
			vals, ok := timing(t, readEvent(t, r))
			if !ok {
				t.Fatal("no timing comment after the role chunk")
			}
			if ev := readEvent(t, r); ev != tt.first {
				t.Fatalf("after the timing comment %q, want %q", ev, tt.first)
			}
			if got := vals["engine_ttft_ms"]; got < float64(hold.Milliseconds()) {
				t.Errorf("engine_ttft_ms = %v, below the %v the engine held its first output", got, hold)
			}
			if got, want := s.Load().TTFTMillisP50, vals["engine_ttft_ms"]; math.Abs(got-want) > 0.001 {
				t.Errorf("heartbeat ttft_ms_p50 = %v, want the one sample %v", got, want)
			}

			eng.release <- struct{}{}
			if ev := readEvent(t, r); ev != content {
				t.Errorf("then %q, want the content", ev)
			}
		})
	}
}

// TestRelayPassesEventsVerbatim sends what a relay must not damage: CRLF
// lines, comments, a line far longer than the relay's buffer, and an answer
// whose engine stopped in the middle of an event. All of it reaches the
// client byte for byte, less the simulator's queue comment (its value lands
// in the timing comment) and plus the timing comment before the first token.
func TestRelayPassesEventsVerbatim(t *testing.T) {
	long := chunkHead + `"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("ab", 40<<10) + `"},"logprobs":null,"finish_reason":null}]}` + "\r\n\r\n"
	parts := []string{
		chunkHead + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\r\n\r\n",
		": keep-alive\n\n",
		": sim-queue-ms=2.500\n\n",
		long,
		"data: [DONE]\r\n\r\n",
		"data: {\"cho", // the engine stopped here
	}
	eng := startScriptedEngine(t, strings.Join(parts, ""))
	_, sc := startSidecar(t, eng.srv.URL, nil)
	status, _, got := send(t, context.Background(), http.MethodPost, sc.URL+"/v1/chat/completions",
		`{"messages":[{"role":"user","content":"a"}],"stream":true}`)
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	i := strings.Index(string(got), serving.TimingComment)
	if i < 0 {
		t.Fatalf("no timing comment in %d bytes", len(got))
	}
	j := i + strings.Index(string(got[i:]), "\n\n") + 2
	vals, ok := timing(t, string(got[i:j]))
	if !ok || vals["engine_queue_ms"] != 2.5 {
		t.Errorf("timing comment %q, want engine_queue_ms=2.500", got[i:j])
	}
	want := parts[0] + parts[1] + long + parts[4] + parts[5]
	if rest := string(got[:i]) + string(got[j:]); rest != want || string(got[j:j+len(long)]) != long {
		t.Errorf("relayed (less the timing comment) differs from what the engine sent:\n%.300q\nwant\n%.300q", rest, want)
	}
}
