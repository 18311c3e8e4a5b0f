package server_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// TestJSONAnswerBrokenMidStreamIsRetriedElsewhere: a JSON client gets
// nothing before the whole answer, so a replica that dies after its first
// token (a SIGKILLed worker) is not the client's error: the answer starts
// again on another replica, the client gets a 200, and what the broken
// attempt generated is recorded as overhead, not billed.
func TestJSONAnswerBrokenMidStreamIsRetriedElsewhere(t *testing.T) {
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"`+servertest.SimModel+
			`","choices":[{"index":0,"delta":{"role":"assistant","content":"half"},"finish_reason":null}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}`+"\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection dies mid-answer
	}))
	t.Cleanup(broken.Close)
	h := servertest.Start(t, servertest.Options{Replicas: 1, Router: router.Config{Selector: prefer("broken")}})
	h.AddReplica("broken", broken.URL, "")
	secret := h.Key(policy.KeyOptions{})

	resp := h.Post("/v1/chat/completions", secret, `{"model":"`+servertest.SimModel+`","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Tailgate-Replica") != "sim-a" || strings.Contains(string(b), "half") {
		t.Fatalf("%d via %q: %s; want the whole answer from sim-a", resp.StatusCode, resp.Header.Get("X-Tailgate-Replica"), b)
	}
	rows := h.LedgerRows()
	if len(rows) != 1 {
		t.Fatalf("ledger %+v", rows)
	}
	r := rows[0]
	if r.Outcome != "ok" || r.Upstream != "sim-a" || r.Attempts != 2 || r.HedgeOverheadTokens != 10 || r.CompletionTokens != 4 {
		t.Fatalf("ledger row %+v: want ok from sim-a after 2 attempts, the broken one's 10 tokens as overhead, 4 billed", r)
	}
}
