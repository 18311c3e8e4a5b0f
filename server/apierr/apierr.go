// Package apierr is the one definition of OpenAI's error shape for
// tailgate's HTTP APIs: {"error":{"message","type","param","code"}} with a
// matching status and, when the client should back off, Retry-After; and,
// on Anthropic's Messages API, of that API's shape (anthropic.go).
//
// It owns how an error is rendered and written, not which error a failure
// becomes: that table (server's toAPIError) stays in package server. It
// must not import any tailgate package.
package apierr

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
)

// Error is an error as OpenAI clients expect it, with its HTTP status.
type Error struct {
	Status  int
	Type    string
	Code    string // "" is sent as null
	Param   string // "" is sent as null
	Message string
	// RetryAfter, when positive, is sent as the Retry-After header (whole
	// seconds, rounded up).
	RetryAfter time.Duration
}

func (e *Error) Error() string { return e.Message }

// BadRequest returns a 400 invalid_request error about param ("" for the
// whole request).
func BadRequest(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_request", Param: param,
		Message: fmt.Sprintf(format, args...)}
}

// Body renders e in OpenAI's shape; an empty Param or Code is null.
func (e *Error) Body() []byte {
	var param, code any
	if e.Param != "" {
		param = e.Param
	}
	if e.Code != "" {
		code = e.Code
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": e.Message, "type": e.Type, "param": param, "code": code,
	}})
	return b
}

// Write sends e in OpenAI's shape — in Anthropic's to a writer marked by
// [Anthropic] — with Retry-After (and retry-after-ms) when e has one. A 401
// also ends the connection (see refuse).
func Write(w http.ResponseWriter, e *Error) {
	h := w.Header()
	if e.RetryAfter > 0 {
		secs := int64((e.RetryAfter + time.Second - 1) / time.Second)
		h.Set("Retry-After", strconv.FormatInt(secs, 10))
		// OpenAI's SDKs prefer the millisecond form when it is there.
		h.Set("Retry-After-Ms", strconv.FormatInt(e.RetryAfter.Milliseconds(), 10))
	}
	if e.Status == http.StatusUnauthorized {
		refuse(w)
	}
	var body []byte
	if isAnthropic(w) {
		body = e.AnthropicBody(h.Get("X-Request-Id"))
	} else {
		body = e.Body()
	}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(e.Status)
	_, _ = w.Write(body)
}

// RefusedDrain is how long the server still reads the unread body of a
// request refused for its credentials before it closes the connection: a
// body already sent is read (so the client sees the answer, not a reset),
// one trickled in never holds the connection.
const RefusedDrain = time.Second

// refuse ends the connection of a request without valid credentials after
// its answer: such a client gets no keep-alive connection to hold and no
// wait for the rest of its body.
func refuse(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(RefusedDrain))
}

// Reply sends e as the answer of an echo handler unless the response is
// already committed. It returns nil, so a handler can return it.
func Reply(c echo.Context, e *Error) error {
	if c.Response().Committed {
		return nil
	}
	Write(c.Response(), e)
	return nil
}
