package apierr

import (
	"encoding/json"
	"net/http"
)

// Anthropic returns w marked as an answer of Anthropic's Messages API: an
// error written to it, or to any writer that unwraps to it (echo's
// Response, http.ResponseController's chain), leaves in that API's shape
// (see AnthropicBody), which Anthropic's SDKs parse into their error types;
// and every answer's X-Request-Id is also sent as request-id, the header
// those SDKs read the request id from.
func Anthropic(w http.ResponseWriter) http.ResponseWriter { return &anthropicWriter{w} }

type anthropicWriter struct{ http.ResponseWriter }

func (w *anthropicWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *anthropicWriter) WriteHeader(status int) {
	if h := w.Header(); h.Get("Request-Id") == "" {
		if id := h.Get("X-Request-Id"); id != "" {
			h.Set("Request-Id", id)
		}
	}
	w.ResponseWriter.WriteHeader(status)
}

// isAnthropic reports whether w is, or unwraps to, a writer Anthropic marked.
func isAnthropic(w http.ResponseWriter) bool {
	for {
		switch x := w.(type) {
		case *anthropicWriter:
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return false
		}
	}
}

// AnthropicType is the Messages API's error type for an HTTP status, as
// Anthropic documents them (https://docs.claude.com/en/api/errors): other
// 4xx are invalid_request_error, other 5xx api_error. A gateway with no
// ready replica (503) is overloaded, as Anthropic's 529 says.
func AnthropicType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusPaymentRequired:
		return "billing_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// AnthropicBody renders e in the Messages API's shape,
// {"type":"error","error":{"type","message"},"request_id"}: the type from
// the status (AnthropicType) — billing_error for a 429 insufficient_quota —
// request_id when one is given.
func (e *Error) AnthropicBody(requestID string) []byte {
	body := struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
		RequestID string `json:"request_id,omitempty"`
	}{Type: "error", RequestID: requestID}
	body.Error.Type, body.Error.Message = AnthropicType(e.Status), e.Message
	if e.Code == "insufficient_quota" {
		// A spent budget, not a rate: Anthropic's type for a billing
		// problem, the status (429, with Retry-After when the budget
		// renews) kept.
		body.Error.Type = "billing_error"
	}
	b, _ := json.Marshal(body)
	return b
}

// Event renders e as the in-band error event that ends a stream already
// under way (its status line long gone), in the shape w's API sends it:
// OpenAI's error chunk, "data: {"error":{…}}", as vLLM writes it mid-stream;
// on a writer marked by [Anthropic], the Messages API's error event,
// "event: error" with AnthropicBody's data — Anthropic's SDKs skip an
// event without a name, and turn this one into their error type
// (anthropic-sdk-go packages/ssestream: Stream.Next, case "error").
func Event(w http.ResponseWriter, e *Error) []byte {
	if isAnthropic(w) {
		body := e.AnthropicBody(w.Header().Get("X-Request-Id"))
		return append(append(append(make([]byte, 0, len(anthropicEvent)+len(body)+2), anthropicEvent...), body...), "\n\n"...)
	}
	body := e.Body()
	return append(append(append(make([]byte, 0, len(openAIEvent)+len(body)+2), openAIEvent...), body...), "\n\n"...)
}

const (
	openAIEvent    = "data: "
	anthropicEvent = "event: error\ndata: "
)
