package server

import (
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/server/apierr"
)

// Anthropic's Messages API as its own clients speak it: the key in
// x-api-key (how @anthropic-ai/sdk, @ai-sdk/anthropic and
// anthropic-sdk-go send it) as well as Bearer, errors in Anthropic's shape,
// and count_tokens. The anthropic-version and anthropic-beta headers those
// clients send are accepted and not forwarded (the gateway's upstream
// request carries its own headers only, attempt.go): vLLM reads neither.
// Its Messages routes take the body (vllm/entrypoints/anthropic/
// api_router.py: create_messages, count_tokens), and the raw request they
// pass on reaches OpenAIServingChat.create_chat_completion
// (vllm/entrypoints/anthropic/serving.py, create_messages), which reads of
// its headers the request id and the trace context alone — both of which
// the gateway sets itself (X-Request-Id, traceparent).

// isMessagesPath reports whether path is one of the Messages API's.
func isMessagesPath(path string) bool {
	return path == "/v1/messages" || strings.HasPrefix(path, "/v1/messages/")
}

// apiKey is the request's API key: an "Authorization: Bearer" header, or on
// the Messages API an x-api-key header.
func apiKey(c echo.Context) string {
	if k := bearer(c.Request()); k != "" {
		return k
	}
	if isMessagesPath(c.Path()) {
		return strings.TrimSpace(c.Request().Header.Get("X-Api-Key"))
	}
	return ""
}

// errMissingMessagesKey is errMissingKey on the Messages API, which takes
// either header.
var errMissingMessagesKey = &apierr.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
	Message: "missing API key: send it as 'x-api-key: <key>' or 'Authorization: Bearer <key>'"}

// anthropicErrors makes every error of h leave in Anthropic's shape (see
// apierr.Anthropic), those the pipeline writes and those echo's error
// handler does.
func anthropicErrors(h echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		c.Response().Writer = apierr.Anthropic(c.Response().Writer)
		return h(c)
	}
}

// readCountTokens reads an Anthropic count_tokens request: Messages without
// max_tokens or stream. The engine tokenizes it as it would render the
// messages for generation and answers {"input_tokens": n} (vLLM:
// vllm/entrypoints/anthropic/serving.py, count_tokens) with no usage, so,
// as /tokenize, nothing is generated and no token is billed: the request is
// authenticated, counted against the key's request rate and recorded in the
// ledger with 0 tokens — Anthropic's own count_tokens is free and limited
// by requests a minute alone. Its worst case reserved is the body's size,
// as every endpoint that only reads its input.
func readCountTokens(ep endpoint, body []byte, _ string, lim parseLimits) (*parsedRequest, error) {
	pr, v, err := readJSONObject(ep, body, lim)
	if err != nil {
		return nil, err
	}
	if !v.Get("messages").IsArray() {
		return nil, apierr.BadRequest("messages", "messages must be a list of messages")
	}
	pr.promptEstimate = 0 // nothing runs on the model (as /tokenize in shapes.go)
	return pr, nil
}
