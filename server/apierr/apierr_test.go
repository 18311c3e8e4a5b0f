package apierr_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/server/apierr"
)

// TestWrite pins the bytes a client gets: OpenAI's shape with an empty
// param or code as null (never an integer or ""), and Retry-After in whole
// seconds rounded up.
func TestWrite(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       *apierr.Error
		wantBody  string
		wantRetry string
	}{
		{"an empty param and code are null",
			&apierr.Error{Status: 502, Type: "server_error", Message: "m"},
			`{"error":{"code":null,"message":"m","param":null,"type":"server_error"}}`, ""},
		{"a bad request names its param and the invalid_request code",
			apierr.BadRequest("model", "model %q is %s", "x", "bad"),
			`{"error":{"code":"invalid_request","message":"model \"x\" is bad","param":"model","type":"invalid_request_error"}}`, ""},
		{"a retry after part of a second asks for a whole second",
			&apierr.Error{Status: 429, Type: "requests", Code: "rate_limit_exceeded", Message: "slow down", RetryAfter: 1200 * time.Millisecond},
			`{"error":{"code":"rate_limit_exceeded","message":"slow down","param":null,"type":"requests"}}`, "2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			apierr.Write(rec, tc.err)
			if rec.Code != tc.err.Status || rec.Body.String() != tc.wantBody ||
				rec.Header().Get("Retry-After") != tc.wantRetry || rec.Header().Get("Content-Type") != "application/json" {
				t.Errorf("got %d %q Retry-After %q; want %d %q Retry-After %q",
					rec.Code, rec.Body, rec.Header().Get("Retry-After"), tc.err.Status, tc.wantBody, tc.wantRetry)
			}
		})
	}
}

func TestReplyLeavesACommittedResponseAlone(t *testing.T) {
	rec := httptest.NewRecorder()
	c := echo.New().NewContext(httptest.NewRequest(http.MethodGet, "/", nil), rec)
	_ = c.String(http.StatusOK, "answer")
	if err := apierr.Reply(c, apierr.BadRequest("", "too late")); err != nil || rec.Code != http.StatusOK || rec.Body.String() != "answer" {
		t.Errorf("Reply after the answer: %v, %d %q", err, rec.Code, rec.Body)
	}
}
