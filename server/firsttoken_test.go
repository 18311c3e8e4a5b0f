package server_test

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// TestFirstTokenOfAnyKindIsRelayedAtOnce: a reasoning delta, a tool-call
// delta or a refusal is the first token (DESIGN). The gateway relays it
// before the engine sends anything else — the engine waits until the
// client has it — and a reasoning phase longer than the TTFT deadline is
// not killed, since its first token came in time.
func TestFirstTokenOfAnyKindIsRelayedAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first string // vLLM's chunk carrying the first output
	}{
		{"reasoning_content", `{"id":"c","object":"chat.completion.chunk","created":1,"model":"broken","choices":[{"index":0,"delta":{"reasoning_content":"Let me think"},"logprobs":null,"finish_reason":null}]}`},
		{"reasoning", `{"id":"c","object":"chat.completion.chunk","created":1,"model":"broken","choices":[{"index":0,"delta":{"reasoning":"Hmm"},"logprobs":null,"finish_reason":null}]}`},
		{"tool call", `{"id":"c","object":"chat.completion.chunk","created":1,"model":"broken","choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","index":0,"function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}]}`},
		{"refusal", `{"id":"c","object":"chat.completion.chunk","created":1,"model":"broken","choices":[{"index":0,"delta":{"refusal":"I can't"},"logprobs":null,"finish_reason":null}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := servertest.Start(t, servertest.Options{Replicas: 1, Server: server.Config{TTFTDeadline: 200 * time.Millisecond}})
			release := make(chan struct{})
			fakeEngine(t, h, "fake", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(200)
				io.WriteString(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"broken\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n")
				io.WriteString(w, "data: "+tc.first+"\n\n")
				w.(http.Flusher).Flush()
				select { // the rest only once the client holds the first token
				case <-release:
				case <-r.Context().Done():
					return
				}
				time.Sleep(300 * time.Millisecond) // longer than the TTFT deadline
				io.WriteString(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"broken\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Sunny.\"},\"logprobs\":null,\"finish_reason\":\"stop\"}]}\n\n")
				io.WriteString(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"broken\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"total_tokens\":25,\"completion_tokens\":20}}\n\n")
				io.WriteString(w, "data: [DONE]\n\n")
			})
			resp := h.Post("/v1/chat/completions", h.Key(policy.KeyOptions{}), `{"model":"broken","stream":true,"messages":[{"role":"user","content":"weather?"}]}`)
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			got := make(chan string, 1)
			br := bufio.NewReader(resp.Body)
			var rest strings.Builder
			go func() {
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						close(got)
						return
					}
					if strings.Contains(line, tc.first[strings.Index(tc.first, `"delta"`):]) {
						got <- line
						close(release)
						io.Copy(&rest, br)
						close(got)
						return
					}
				}
			}()
			select {
			case _, ok := <-got:
				if !ok {
					t.Fatal("the stream ended without the first token")
				}
			case <-time.After(10 * time.Second):
				close(release)
				t.Fatal("the first token was held back until more output came")
			}
			<-got // the rest of the stream
			if !strings.Contains(rest.String(), "Sunny.") || !strings.Contains(rest.String(), "[DONE]") || strings.Contains(rest.String(), `"error"`) {
				t.Fatalf("the stream did not complete: %q", rest.String())
			}
			rows := h.LedgerRows()
			if len(rows) != 1 || rows[0].Outcome != data.OutcomeOK || rows[0].CompletionTokens != 20 {
				t.Fatalf("ledger %+v", rows)
			}
		})
	}
}
