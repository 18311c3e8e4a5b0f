package sidecar

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strconv"
)

// apiError is a refusal of the sidecar's own, answered in OpenAI's error
// shape. Errors of the engine are relayed as the engine sent them.
type apiError struct {
	status     int
	typ        string
	code       string
	msg        string
	retryAfter bool // send "Retry-After: 1"
}

var (
	errUnauthorized = &apiError{status: http.StatusUnauthorized, typ: "invalid_request_error",
		code: "invalid_cluster_token", msg: "missing or wrong cluster token"}
	errDraining = &apiError{status: http.StatusServiceUnavailable, typ: "server_error",
		code: "replica_draining", msg: "the replica is draining and takes no new requests", retryAfter: true}
	errEngineUnavailable = &apiError{status: http.StatusServiceUnavailable, typ: "server_error",
		code: "engine_unavailable", msg: "the engine is not reachable", retryAfter: true}
	errEngine = &apiError{status: http.StatusBadGateway, typ: "server_error",
		code: "engine_error", msg: "the engine failed before answering"}
	errBodyTooLarge = &apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error",
		code: "body_too_large", msg: "request body too large"}
	errBadBody = &apiError{status: http.StatusBadRequest, typ: "invalid_request_error",
		code: "bad_request", msg: "could not read the request body"}
	errNotFound = &apiError{status: http.StatusNotFound, typ: "invalid_request_error",
		code: "not_found", msg: "no such endpoint"}
	errMethod = &apiError{status: http.StatusMethodNotAllowed, typ: "invalid_request_error",
		code: "method_not_allowed", msg: "method not allowed"}
)

func notReady(state, reason string) *apiError {
	msg := "the replica is not ready (" + state + ")"
	if reason != "" {
		msg += ": " + reason
	}
	return &apiError{status: http.StatusServiceUnavailable, typ: "server_error",
		code: "replica_not_ready", msg: msg, retryAfter: true}
}

func writeError(w http.ResponseWriter, e *apiError) {
	type info struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	}
	body, _ := json.Marshal(struct {
		Error info `json:"error"`
	}{info{Message: e.msg, Type: e.typ, Code: e.code}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if e.retryAfter {
		h.Set("Retry-After", "1")
	}
	if e.status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", "Bearer")
	}
	w.WriteHeader(e.status)
	_, _ = w.Write(body)
}

// requireToken refuses requests without the cluster token. Hashing both
// sides first keeps the comparison constant-time in the token's length too.
func (s *Sidecar) requireToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := sha256.Sum256([]byte(r.Header.Get("Authorization")))
		if subtle.ConstantTimeCompare(got[:], s.tokenSum[:]) != 1 {
			writeError(w, errUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
