package sim

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// An engine with an API key refuses /v1 requests without it, as vLLM does,
// and leaves the paths vLLM leaves open alone.
func TestAPIKeyGuardsV1Paths(t *testing.T) {
	t.Parallel()
	_, srv := start(t, Config{APIKey: "k3y"})
	chat := `{"model":"tailgate-sim","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	tests := []struct {
		name, method, path, auth, body string
		want                           int
	}{
		{"chat without key", "POST", "/v1/chat/completions", "", chat, 401},
		{"chat with wrong key", "POST", "/v1/chat/completions", "Bearer nope", chat, 401},
		{"chat with key not as bearer", "POST", "/v1/chat/completions", "k3y", chat, 401},
		{"chat with key", "POST", "/v1/chat/completions", "Bearer k3y", chat, 200},
		{"models without key", "GET", "/v1/models", "", "", 401},
		{"models with key", "GET", "/v1/models", "Bearer k3y", "", 200},
		{"health without key", "GET", "/health", "", "", 200},
		{"metrics without key", "GET", "/metrics", "", "", 200},
		{"preflight without key", "OPTIONS", "/v1/models", "", "", 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, srv.URL+tt.path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Fatalf("%s %s = %d %s, want %d", tt.method, tt.path, resp.StatusCode, body, tt.want)
			}
			if tt.want == 401 && string(body) != `{"error":"Unauthorized"}` {
				t.Errorf("401 body = %s, want vLLM's", body)
			}
		})
	}
}

// Without a key nothing is guarded.
func TestNoAPIKeyServesAll(t *testing.T) {
	t.Parallel()
	_, srv := start(t, Config{})
	resp, err := http.Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("GET /v1/models = %d, want 200", resp.StatusCode)
	}
}
