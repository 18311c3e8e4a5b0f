package apierr_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/server/apierr"
)

// TestAnthropicShape pins the bytes an Anthropic client gets through echo's
// response (which unwraps to the marked writer): the type named for the
// status, the request id in the body and as request-id, Retry-After kept.
func TestAnthropicShape(t *testing.T) {
	for _, tc := range []struct {
		err  *apierr.Error
		want string
	}{
		{&apierr.Error{Status: 401, Type: "invalid_request_error", Code: "invalid_api_key", Message: "invalid API key"},
			`{"type":"error","error":{"type":"authentication_error","message":"invalid API key"},"request_id":"req_1"}`},
		{&apierr.Error{Status: 429, Type: "requests", Code: "rate_limit_exceeded", Message: "slow down", RetryAfter: time.Second},
			`{"type":"error","error":{"type":"rate_limit_error","message":"slow down"},"request_id":"req_1"}`},
		{&apierr.Error{Status: 429, Type: "insufficient_quota", Code: "insufficient_quota", Message: "spent"},
			`{"type":"error","error":{"type":"billing_error","message":"spent"},"request_id":"req_1"}`},
		{&apierr.Error{Status: 502, Type: "server_error", Message: "m"},
			`{"type":"error","error":{"type":"api_error","message":"m"},"request_id":"req_1"}`},
	} {
		rec := httptest.NewRecorder()
		c := echo.New().NewContext(httptest.NewRequest(http.MethodPost, "/v1/messages", nil), rec)
		c.Response().Writer = apierr.Anthropic(c.Response().Writer)
		c.Response().Header().Set("X-Request-Id", "req_1")
		_ = apierr.Reply(c, tc.err)
		if rec.Code != tc.err.Status || rec.Body.String() != tc.want || rec.Header().Get("Request-Id") != "req_1" ||
			(tc.err.RetryAfter > 0) != (rec.Header().Get("Retry-After") != "") {
			t.Errorf("got %d %s (request-id %q, Retry-After %q); want %d %s", rec.Code, rec.Body, rec.Header().Get("Request-Id"),
				rec.Header().Get("Retry-After"), tc.err.Status, tc.want)
		}
	}
	// Unmarked, the same error keeps OpenAI's shape.
	rec := httptest.NewRecorder()
	apierr.Write(rec, &apierr.Error{Status: 401, Type: "invalid_request_error", Code: "invalid_api_key", Message: "invalid API key"})
	if want := `{"error":{"code":"invalid_api_key","message":"invalid API key","param":null,"type":"invalid_request_error"}}`; rec.Body.String() != want {
		t.Errorf("unmarked: %s", rec.Body)
	}
}

// TestEventTakesTheStreamsShape pins the in-band error event's bytes: the
// Messages API's named error event on a marked writer, OpenAI's error chunk
// elsewhere.
func TestEventTakesTheStreamsShape(t *testing.T) {
	e := &apierr.Error{Status: 503, Type: "server_error", Code: "no_replica", Message: "no ready replica"}
	rec := httptest.NewRecorder()
	rec.Header().Set("X-Request-Id", "req_1")
	if got, want := string(apierr.Event(apierr.Anthropic(rec), e)),
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"no ready replica\"},\"request_id\":\"req_1\"}\n\n"; got != want {
		t.Errorf("anthropic: %q, want %q", got, want)
	}
	if got, want := string(apierr.Event(rec, e)),
		"data: {\"error\":{\"code\":\"no_replica\",\"message\":\"no ready replica\",\"param\":null,\"type\":\"server_error\"}}\n\n"; got != want {
		t.Errorf("openai: %q, want %q", got, want)
	}
}
