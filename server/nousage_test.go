package server_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// TestEngineWithoutUsageIsBilledWhatReachedTheClient: an OpenAI-compatible
// upstream that ignores stream_options and never reports usage. A JSON
// answer is billed what reached the client — not nothing: assembled from
// the engine's stream (two replicas), the output pieces and the estimated
// prompt; relayed as the engine's own JSON (one replica), the estimated
// prompt and the answer's text at about 4 bytes a token.
func TestEngineWithoutUsageIsBilledWhatReachedTheClient(t *testing.T) {
	const model = "plain-model"
	var streamed, plain atomic.Int32
	engine := func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if gjson.GetBytes(body, "stream").Type != gjson.True {
			plain.Add(1)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"one two three four five six seven eight"},"finish_reason":"stop"}]}`, model)
			return
		}
		streamed.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := func(delta, finish string) {
			fmt.Fprintf(w, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":%q,"choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n", model, delta, finish)
		}
		chunk(`{"role":"assistant","content":""}`, "null")
		for _, piece := range []string{"one ", "two ", "three"} {
			chunk(fmt.Sprintf(`{"content":%q}`, piece), "null")
		}
		chunk(`{}`, `"stop"`)
		io.WriteString(w, "data: [DONE]\n\n")
	}
	for _, tc := range []struct {
		name       string
		replicas   int
		answer     string
		completion int64 // billed
	}{
		{"assembled from two replicas' streams", 2, "one two three", 3},
		{"relayed from the only replica", 1, "one two three four five six seven eight", 10}, // 39 bytes of text
	} {
		t.Run(tc.name, func(t *testing.T) {
			streamed.Store(0)
			plain.Store(0)
			h := servertest.Start(t, servertest.Options{Replicas: 1})
			for i := range tc.replicas {
				srv := httptest.NewServer(http.HandlerFunc(engine))
				t.Cleanup(srv.Close)
				h.AddReplica(fmt.Sprintf("plain-%d", i), srv.URL, model)
			}
			secret := h.Key(policy.KeyOptions{})
			resp := h.Post("/v1/chat/completions", secret, `{"model":"`+model+`","messages":[{"role":"user","content":"count"}]}`)
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || gjson.GetBytes(raw, "choices.0.message.content").Str != tc.answer {
				t.Fatalf("answer %d %s", resp.StatusCode, raw)
			}
			if s, p := streamed.Load(), plain.Load(); (tc.replicas > 1) != (s == 1) || s+p != 1 {
				t.Fatalf("engine asked for %d streams and %d JSON answers", s, p)
			}
			rows := h.LedgerRows()
			if len(rows) != 1 {
				t.Fatalf("%d ledger rows, want 1", len(rows))
			}
			if r := rows[0]; r.CompletionTokens != tc.completion || r.PromptTokens == 0 {
				t.Errorf("billed %d prompt and %d completion tokens; want the estimated prompt and %d", r.PromptTokens, r.CompletionTokens, tc.completion)
			}
			if !strings.Contains(string(raw), `"object":"chat.completion"`) {
				t.Errorf("not a chat completion: %s", raw)
			}
		})
	}
}
