package server_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// TestSessionIsReadFromEachNamedField: with session affinity, a session
// named in any of the honoured places — the x-session-affinity header,
// prompt_cache_key or user (chat, completions, responses), metadata.user_id
// (messages) — is the same session: each request goes to the replica the
// session's first turn went to, counted as having stayed there.
func TestSessionIsReadFromEachNamedField(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 6, Router: router.Config{Affinity: router.AffinitySession}})
	secret := h.Key(policy.KeyOptions{})
	send := func(path, body, header string) string {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, h.Public.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", "application/json")
		if header != "" {
			req.Header.Set("X-Session-Affinity", header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", path, resp.StatusCode, b)
		}
		return resp.Header.Get("X-Tailgate-Replica")
	}
	const model = `"model":"tailgate-sim","max_tokens":2`
	fields := []struct {
		name, path string
		body       func(session string, i int) string
		header     bool
	}{
		{"prompt_cache_key (chat)", "/v1/chat/completions", func(s string, i int) string {
			return fmt.Sprintf(`{%s,"prompt_cache_key":%q,"messages":[{"role":"user","content":"turn %d"}]}`, model, s, i)
		}, false},
		{"user (chat)", "/v1/chat/completions", func(s string, i int) string {
			return fmt.Sprintf(`{%s,"user":%q,"messages":[{"role":"user","content":"turn %d"}]}`, model, s, i)
		}, false},
		{"prompt_cache_key (completions)", "/v1/completions", func(s string, i int) string {
			return fmt.Sprintf(`{%s,"prompt_cache_key":%q,"prompt":"turn %d"}`, model, s, i)
		}, false},
		{"user (completions)", "/v1/completions", func(s string, i int) string {
			return fmt.Sprintf(`{%s,"user":%q,"prompt":"turn %d"}`, model, s, i)
		}, false},
		{"prompt_cache_key (responses)", "/v1/responses", func(s string, i int) string {
			return fmt.Sprintf(`{"model":"tailgate-sim","max_output_tokens":2,"prompt_cache_key":%q,"input":"turn %d"}`, s, i)
		}, false},
		{"user (responses)", "/v1/responses", func(s string, i int) string {
			return fmt.Sprintf(`{"model":"tailgate-sim","max_output_tokens":2,"user":%q,"input":"turn %d"}`, s, i)
		}, false},
		{"metadata.user_id (messages)", "/v1/messages", func(s string, i int) string {
			return fmt.Sprintf(`{%s,"metadata":{"user_id":%q},"messages":[{"role":"user","content":"turn %d"}]}`, model, s, i)
		}, false},
		{"x-session-affinity header", "/v1/chat/completions", func(_ string, i int) string {
			return fmt.Sprintf(`{%s,"messages":[{"role":"user","content":"turn %d"}]}`, model, i)
		}, true},
	}
	stayed := func() float64 { return counterSum(t, h, "tailgate_session_routes_total", "outcome", "stayed") }
	for k := range 3 { // three sessions, so no field matches by luck
		session := fmt.Sprintf("conversation-%d", k)
		home := send("/v1/chat/completions", fmt.Sprintf(`{%s,"messages":[{"role":"user","content":"first turn"}]}`, model), session)
		for i, f := range fields {
			header := ""
			if f.header {
				header = session
			}
			before := stayed()
			got := send(f.path, f.body(session, i), header)
			if got != home {
				t.Errorf("%s: session %s went to %s, want %s where its first turn went", f.name, session, got, home)
			}
			if after := stayed(); after != before+1 {
				t.Errorf("%s: tailgate_session_routes_total{stayed} %v → %v; want one more (the request named its session)", f.name, before, after)
			}
		}
	}
	// A request naming no session is not counted as one.
	before := counterSum(t, h, "tailgate_session_routes_total", "outcome", "placed") + stayed()
	send("/v1/chat/completions", fmt.Sprintf(`{%s,"messages":[{"role":"user","content":"no session"}]}`, model), "")
	if after := counterSum(t, h, "tailgate_session_routes_total", "outcome", "placed") + stayed(); after != before {
		t.Errorf("a request naming no session was routed as one")
	}
}
