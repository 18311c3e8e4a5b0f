package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
)

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

var _ net.Error = timeoutErr{}

// TestToAPIErrorTable pins each row of the one table from error kind to the
// status and code a client sees. Each name says why the row exists.
func TestToAPIErrorTable(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        error
		wantStatus int
		wantCode   string
		wantRetry  time.Duration
	}{
		{"a replica's 5xx after all retries is a bad gateway, not a 500",
			router.ErrNoToken(&upstreamStatusError{status: 500}, ""), 502, "upstream_error", 0},
		{"a dropped stream before the first token is a bad gateway",
			router.ErrNoToken(errNoTokenEOF, ""), 502, "upstream_error", 0},
		{"a refused connection on every replica is a bad gateway",
			router.ErrNotSent(errors.New("dial tcp: connection refused")), 502, "upstream_unreachable", 0},
		{"a missed first-token deadline is a gateway timeout",
			router.ErrNoToken(errTTFTDeadline, "ttft_deadline"), 504, "upstream_timeout", 0},
		{"a missed JSON deadline is a gateway timeout",
			router.ErrNoToken(errJSONDeadline, ""), 504, "upstream_timeout", 0},
		{"a network timeout is a gateway timeout",
			router.ErrNoToken(fmt.Errorf("read: %w", timeoutErr{}), ""), 504, "upstream_timeout", 0},
		{"no ready replica is unavailable, retry in a second",
			router.ErrNoReplica, 503, "no_replica", time.Second},
		{"every replica draining is unavailable with the engine's Retry-After",
			router.ErrDeclined(&upstreamStatusError{status: 503, retryAfter: 3 * time.Second}), 503, "no_replica", 3 * time.Second},
		{"a replica ejected while waiting, and no other, is unavailable",
			router.ErrDeclined(errReplicaEjected), 503, "no_replica", time.Second},
		{"an engine 429 and no other replica is a 429 with the engine's Retry-After",
			router.ErrDeclined(&upstreamStatusError{status: 429, retryAfter: 7 * time.Second}), 429, "upstream_overloaded", 7 * time.Second},
		{"an engine 429 without Retry-After still tells the client to wait",
			router.ErrDeclined(&upstreamStatusError{status: 429}), 429, "upstream_overloaded", time.Second},
		{"an engine's 400 is relayed as its own client error with a null code",
			&relayError{status: 400, body: []byte(`{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}`)}, 400, "", 0},
		{"an engine's 422 with a string code keeps it",
			&relayError{status: 422, body: []byte(`{"error":{"message":"bad","code":"unprocessable"}}`)}, 422, "unprocessable", 0},
		{"an engine's 4xx that is not JSON becomes the message",
			&relayError{status: 413, body: []byte("too big")}, 413, "", 0},
		{"a client that went away is recorded as 499",
			router.ErrNoToken(context.Canceled, ""), 499, "client_cancelled", 0},
		{"a key's rate limit is a 429 rate_limit_exceeded",
			&policy.LimitError{Limit: "rpm", RetryAfter: 2 * time.Second}, 429, "rate_limit_exceeded", 2 * time.Second},
		{"anything unknown is a 500 and never leaks its text",
			errors.New("nil map"), 500, "internal_error", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ae := toAPIError(tc.err, "m")
			if ae.Status != tc.wantStatus || ae.Code != tc.wantCode || ae.RetryAfter != tc.wantRetry {
				t.Fatalf("got %d %q retry %v, want %d %q retry %v", ae.Status, ae.Code, ae.RetryAfter, tc.wantStatus, tc.wantCode, tc.wantRetry)
			}
			if ae.Message == "" || ae.Type == "" {
				t.Fatalf("message and type must be set: %+v", ae)
			}
			if tc.wantStatus >= 500 && tc.wantStatus != 499 && ae.Type != "server_error" {
				t.Fatalf("type %q for a server error", ae.Type)
			}
			if ae.Status < 100 || ae.Status > 599 || http.StatusText(ae.Status) == "" && ae.Status != 499 {
				t.Fatalf("status %d is not an HTTP status", ae.Status)
			}
		})
	}
}
