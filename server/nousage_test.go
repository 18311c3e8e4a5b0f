package server_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"tailgate/policy"
	"tailgate/server/internal/servertest"
)

// TestEngineWithoutUsageIsBilledWhatReachedTheClient: an OpenAI-compatible
// upstream that ignores stream_options and never reports usage. A JSON
// answer the gateway assembles from its stream is billed what reached the
// client — the output pieces and the estimated prompt — not nothing.
func TestEngineWithoutUsageIsBilledWhatReachedTheClient(t *testing.T) {
	const model = "plain-model"
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
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
	}))
	defer engine.Close()
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	h.AddReplica("plain", engine.URL, model)
	secret := h.Key(policy.KeyOptions{})

	resp := h.Post("/v1/chat/completions", secret, `{"model":"`+model+`","messages":[{"role":"user","content":"count to three"}]}`)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), "one two three") {
		t.Fatalf("answer %d %s", resp.StatusCode, raw)
	}
	rows := h.LedgerRows()
	if len(rows) != 1 {
		t.Fatalf("%d ledger rows, want 1", len(rows))
	}
	if r := rows[0]; r.CompletionTokens != 3 || r.PromptTokens == 0 {
		t.Errorf("billed %d prompt and %d completion tokens; want the estimated prompt and the 3 pieces delivered", r.PromptTokens, r.CompletionTokens)
	}
}
