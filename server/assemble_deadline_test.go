package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// TestAssembledJSONAnswerDeadlines: a JSON answer the gateway assembles
// from the engine's stream is bounded both between tokens (the inter-token
// idle deadline) and as a whole (the JSON deadline, from the attempt's
// start); whichever passes first ends it with its own 504, and the ledger
// says which.
func TestAssembledJSONAnswerDeadlines(t *testing.T) {
	chunk := func(text string) string {
		return fmt.Sprintf("data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"broken\","+
			"\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":null}]}\n\n", text)
	}
	for _, tc := range []struct {
		name       string
		idle, json time.Duration
		every      time.Duration // between tokens after the first; 0: silence
		wantCode   string
		wantClass  data.ErrorClass
	}{
		{name: "silent after the first token: idle deadline", idle: 100 * time.Millisecond, json: time.Minute,
			wantCode: "upstream_midstream_error", wantClass: data.ClassIdleDeadline},
		{name: "tokens trickle past the whole answer's deadline", idle: time.Minute, json: 300 * time.Millisecond,
			every: 20 * time.Millisecond, wantCode: "upstream_timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := servertest.Start(t, servertest.Options{Replicas: 1, Server: server.Config{
				IdleDeadline: tc.idle, JSONDeadline: tc.json, TTFTDeadline: time.Minute}})
			// Two replicas: JSON is assembled where it can be hedged (the
			// idle one's retry goes to the other, as silent).
			engine := func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, chunk("Hello"))
				w.(http.Flusher).Flush()
				if tc.every == 0 {
					<-r.Context().Done()
					return
				}
				for range 3000 { // a minute of tokens at most
					select {
					case <-r.Context().Done():
						return
					case <-time.After(tc.every):
					}
					io.WriteString(w, chunk(" more"))
					w.(http.Flusher).Flush()
				}
			}
			fakeEngine(t, h, "fake-a", engine)
			fakeEngine(t, h, "fake-b", engine)
			secret := h.Key(policy.KeyOptions{})
			resp := h.Post("/v1/chat/completions", secret, `{"model":"broken","messages":[{"role":"user","content":"hi"}]}`)
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			var e struct {
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			if resp.StatusCode != http.StatusGatewayTimeout || json.Unmarshal(raw, &e) != nil || e.Error.Code != tc.wantCode {
				t.Fatalf("status %d, body %s; want 504 with code %s", resp.StatusCode, raw, tc.wantCode)
			}
			rows := h.LedgerRows()
			if len(rows) != 1 || rows[0].Status != http.StatusGatewayTimeout || (tc.wantClass != "" && rows[0].Error != tc.wantClass) {
				t.Fatalf("ledger %+v, want one 504 row (class %q)", rows, tc.wantClass)
			}
		})
	}
}
