package sim

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// requireKey answers 401 {"error":"Unauthorized"} to requests for /v1 paths
// that do not carry "Authorization: Bearer key", as vLLM's authentication
// middleware does (vllm/entrypoints/openai/api_server.py): OPTIONS and paths
// outside /v1 (/health, /metrics, /tokenize, …) pass without it.
func requireKey(key string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte("Bearer " + key))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodOptions && strings.HasPrefix(r.URL.Path, "/v1") {
			got := sha256.Sum256([]byte(r.Header.Get("Authorization")))
			if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
				writeJSON(w, http.StatusUnauthorized, []byte(`{"error":"Unauthorized"}`))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
