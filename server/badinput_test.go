package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

func TestBadInputGetsOpenAIErrors(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Server: server.Config{MaxBodyBytes: 2048}})
	secret := h.Key(policy.KeyOptions{})
	limited := h.Key(policy.KeyOptions{Tenant: "narrow", Models: []string{"other-model"}})
	revoked := h.Key(policy.KeyOptions{})
	if _, err := policy.RevokeKey(t.Context(), h.Store, revoked); err != nil {
		t.Fatal(err)
	}
	msg := `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name       string
		path       string
		key        string
		body       string
		wantStatus int
		wantCode   string
		wantParam  string
	}{
		{"malformed JSON", "/v1/chat/completions", secret, `{"model":"tailgate-sim",`, 400, "invalid_request", ""},
		{"not an object", "/v1/chat/completions", secret, `[1,2]`, 400, "invalid_request", ""},
		{"empty body", "/v1/chat/completions", secret, ``, 400, "invalid_request", ""},
		{"missing model", "/v1/chat/completions", secret, `{` + msg + `}`, 400, "invalid_request", "model"},
		{"model a number", "/v1/chat/completions", secret, `{"model":7,` + msg + `}`, 400, "invalid_request", "model"},
		{"missing messages", "/v1/chat/completions", secret, `{"model":"tailgate-sim"}`, 400, "invalid_request", "messages"},
		{"messages a string", "/v1/chat/completions", secret, `{"model":"tailgate-sim","messages":"hi"}`, 400, "invalid_request", "messages"},
		{"message without role", "/v1/chat/completions", secret, `{"model":"tailgate-sim","messages":[{"content":"hi"}]}`, 400, "invalid_request", "messages"},
		{"stream a string", "/v1/chat/completions", secret, `{"model":"tailgate-sim","stream":"yes",` + msg + `}`, 400, "invalid_request", "stream"},
		{"max_tokens a string", "/v1/chat/completions", secret, `{"model":"tailgate-sim","max_tokens":"9",` + msg + `}`, 400, "invalid_request", "max_tokens"},
		{"max_tokens negative", "/v1/chat/completions", secret, `{"model":"tailgate-sim","max_tokens":-1,` + msg + `}`, 400, "invalid_request", "max_tokens"},
		{"missing prompt", "/v1/completions", secret, `{"model":"tailgate-sim"}`, 400, "invalid_request", "prompt"},
		{"oversized body", "/v1/chat/completions", secret, `{"model":"tailgate-sim","messages":[{"role":"user","content":"` + strings.Repeat("x", 4096) + `"}]}`, 413, "request_too_large", ""},
		{"unknown model", "/v1/chat/completions", secret, `{"model":"gpt-9",` + msg + `}`, 404, "model_not_found", "model"},
		{"model not allowed", "/v1/chat/completions", limited, `{"model":"tailgate-sim",` + msg + `}`, 403, "model_not_allowed", "model"},
		{"missing key", "/v1/chat/completions", "", `{"model":"tailgate-sim",` + msg + `}`, 401, "invalid_api_key", ""},
		{"invalid key", "/v1/chat/completions", "tg-not-a-real-key", `{"model":"tailgate-sim",` + msg + `}`, 401, "invalid_api_key", ""},
		{"revoked key", "/v1/chat/completions", revoked, `{"model":"tailgate-sim",` + msg + `}`, 401, "invalid_api_key", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.Post(tc.path, tc.key, tc.body)
			defer resp.Body.Close()
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.wantStatus)
			}
			code, _, param := decodeError(t, resp)
			if code != tc.wantCode || param != tc.wantParam {
				t.Fatalf("code %q param %q, want %q %q", code, param, tc.wantCode, tc.wantParam)
			}
			if resp.Header.Get("X-Request-Id") == "" {
				t.Fatal("no x-request-id")
			}
		})
	}
	// The gateway is still up and serving, and nothing was billed.
	resp := h.Post("/v1/chat/completions", secret, `{"model":"tailgate-sim","max_tokens":2,`+msg+`}`)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("after bad input, a good request got %d", resp.StatusCode)
	}
	var billed, ok int64
	for _, r := range h.LedgerRows() {
		billed += r.PromptTokens + r.CompletionTokens
		if r.Outcome == "ok" {
			ok++
		}
	}
	if ok != 1 || billed != 2+int64(3+4+1) {
		t.Fatalf("ledger: %d ok rows, %d tokens billed; want 1 and %d", ok, billed, 2+3+4+1)
	}
}

func TestMetricsAndAdminNeedTheAdminToken(t *testing.T) {
	h := servertest.Start(t, servertest.Options{})
	for _, path := range []string{"/metrics", "/admin/v1/keys", "/admin/v1/usage", "/admin/v1/requests", "/admin/v1/replicas"} {
		resp, err := http.Get(h.Admin.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Errorf("%s without token: %d", path, resp.StatusCode)
		}
	}
}
