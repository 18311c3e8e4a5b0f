package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/apierr"
)

// The errors a client of the public or admin API can see, in apierr's one
// OpenAI shape, and toAPIError: the one table from any error to one of them.
var (
	errBodyTooLarge = &apierr.Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
		Message: "request body is too large"}
	errBodyTimeout = &apierr.Error{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Code: "request_timeout",
		Message: "the request body did not arrive in time"}
	errMissingKey = &apierr.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
		Message: "missing API key: send it as 'Authorization: Bearer <key>'"}
	errBadKey = &apierr.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
		Message: "invalid API key"}
	errBadAdminToken = &apierr.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_admin_token",
		Message: "missing or invalid admin token"}
	errNoReplica = &apierr.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: string(data.ClassNoReplica),
		Message: "no replica is ready to serve this model; try again shortly", RetryAfter: time.Second}
	errUpstream = &apierr.Error{Status: http.StatusBadGateway, Type: "server_error", Code: string(data.ClassUpstreamError),
		Message: "the model replica failed to answer"}
	errUnreachable = &apierr.Error{Status: http.StatusBadGateway, Type: "server_error", Code: string(data.ClassUpstreamUnreachable),
		Message: "no model replica could be reached"}
	errUpstreamTimeout = &apierr.Error{Status: http.StatusGatewayTimeout, Type: "server_error", Code: string(data.ClassUpstreamTimeout),
		Message: "the model replica did not answer in time"}
	errClientGone = &apierr.Error{Status: statusClientClosed, Type: "invalid_request_error", Code: string(data.ClassClientCancelled),
		Message: "the client closed the request"}
	errMidstream = &apierr.Error{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_midstream_error",
		Message: "the model replica failed in the middle of the answer; the output is incomplete"}
	errIdle = &apierr.Error{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "upstream_midstream_error",
		Message: "the model replica stopped sending tokens in the middle of the answer; the output is incomplete"}
	errLedgerUnavailable = &apierr.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "ledger_unavailable",
		Message: "the gateway cannot record usage right now (its ledger cannot write), so it takes no new requests; try again shortly", RetryAfter: time.Second}
	errInternal = &apierr.Error{Status: http.StatusInternalServerError, Type: "server_error", Code: string(data.ClassInternal),
		Message: "internal error"}
)

// statusClientClosed is what the ledger and the metrics record for a client
// that went away before its answer (nginx's 499); no client ever sees it.
const statusClientClosed = 499

// errExpiredKey answers a key that exists but has expired: its holder is
// told when, and that an administrator can extend it.
func errExpiredKey(e *policy.ExpiredKeyError) *apierr.Error {
	if e.Rotated {
		return &apierr.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "rotated_api_key",
			Message: fmt.Sprintf("this API key was rotated: its old secret stopped working at %s; use the new secret",
				e.ExpiresAt.UTC().Format(time.RFC3339))}
	}
	return &apierr.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "expired_api_key",
		Message: fmt.Sprintf("this API key expired at %s; ask an administrator to extend it (tailgate keys edit --expires) or for a new key",
			e.ExpiresAt.UTC().Format(time.RFC3339))}
}

func errModelNotAllowed(model string) *apierr.Error {
	return &apierr.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "model_not_allowed", Param: "model",
		Message: fmt.Sprintf("this API key may not use the model %q", model)}
}

// toAPIError maps any error of the request path to the one the client sees.
// This is the one table from error kind to HTTP status; the order of the
// cases matters where an error is of several kinds (a deadline is also a
// failed attempt). Its last rows follow caddy's reverse proxy: a replica
// that failed or could not be reached is a bad gateway (502), a deadline is
// a gateway timeout (504), a client that went away is 499.
func toAPIError(err error, model string) *apierr.Error {
	var (
		ae    *apierr.Error
		limit *policy.LimitError
		quota *policy.QuotaError
		he    *echo.HTTPError
		mbe   *http.MaxBytesError
		rel   *relayError
		us    *upstreamStatusError
		ne    net.Error
		exp   *policy.ExpiredKeyError
	)
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &limit):
		kind := limit.Limit
		retry := limit.RetryAfter
		if retry <= 0 {
			retry = time.Second // concurrency: a slot frees when a request ends
		}
		return &apierr.Error{Status: http.StatusTooManyRequests, Type: "requests", Code: "rate_limit_exceeded",
			Message:    fmt.Sprintf("rate limit exceeded (%s); retry after %s", kind, limit.RetryAfter.Round(time.Millisecond)),
			RetryAfter: retry}
	case errors.As(err, &quota):
		e := &apierr.Error{Status: http.StatusTooManyRequests, Type: "insufficient_quota", Code: "insufficient_quota",
			Message: quotaMessage(quota)}
		if !quota.ResetsAt.IsZero() {
			e.RetryAfter = max(time.Until(quota.ResetsAt), time.Second) // a periodic budget is whole again then
		}
		return e
	case errors.As(err, &exp):
		return errExpiredKey(exp)
	case errors.Is(err, policy.ErrInvalidKey):
		return errBadKey
	case errors.Is(err, policy.ErrModelNotAllowed):
		return errModelNotAllowed(model)
	case errors.Is(err, data.ErrLedgerUnavailable):
		return errLedgerUnavailable
	case errors.Is(err, router.ErrUnknownModel):
		return errUnknownModel(model, nil)
	case errors.As(err, &mbe):
		return errBodyTooLarge
	case errors.As(err, &he):
		msg := http.StatusText(he.Code)
		if m, ok := he.Message.(string); ok {
			msg = m
		}
		typ := "invalid_request_error"
		if he.Code >= 500 {
			typ = "server_error"
		}
		return &apierr.Error{Status: he.Code, Type: typ, Code: "http_" + strconv.Itoa(he.Code), Message: msg}

	// The routed path, from the engine's own answer to the gateway's view.
	case errors.As(err, &rel):
		return rel.apiError()
	case errors.Is(err, context.Canceled):
		return errClientGone
	case errors.Is(err, router.ErrHoldFull), errors.Is(err, router.ErrHoldTimeout):
		return holdError(err, model)
	case errors.Is(err, errTTFTDeadline), errors.Is(err, errJSONDeadline), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return errUpstreamTimeout
	case router.IsDeclined(err) && errors.As(err, &us) && us.status == http.StatusTooManyRequests:
		// Every replica that could take it is busy: the engine's 429, with
		// its Retry-After, so the client backs off as the engine asked.
		return &apierr.Error{Status: http.StatusTooManyRequests, Type: "server_error", Code: string(data.ClassUpstreamOverloaded),
			Message:    fmt.Sprintf("every replica of the model %q is at capacity; retry after %s", model, max(us.retryAfter, time.Second)),
			RetryAfter: max(us.retryAfter, time.Second)}
	case errors.Is(err, router.ErrNoReplica), router.IsDeclined(err):
		e := *errNoReplica
		nre, _ := errors.AsType[*router.NoReplicaError](err)
		e.Message = noReplicaMessage(model, nre)
		if errors.As(err, &us) && us.retryAfter > 0 {
			e.RetryAfter = us.retryAfter
		}
		return &e
	case router.IsNotSent(err):
		return errUnreachable
	case router.IsNoToken(err):
		return errUpstream
	}
	return errInternal
}

// quotaMessage says why a budget refused a request: used up, or — with
// nothing spent, possibly — smaller than the worst case the request must
// reserve, with the amounts, so a client can tell "wait for next month" from
// "ask for fewer tokens".
func quotaMessage(q *policy.QuotaError) string {
	amount, what := func(v int64) string { return strconv.FormatInt(v, 10) }, "token budget"
	unit := " tokens"
	if q.Budget == "cost" {
		amount = func(v int64) string { return strconv.FormatFloat(float64(v)/1e6, 'f', -1, 64) }
		what, unit = "cost budget", ""
	}
	if q.Period != "" {
		what = q.Period + " " + what
	}
	if q.UsedUp() {
		return fmt.Sprintf("you exceeded your current quota: the tenant's %s is used up (%s of %s%s spent, %s reserved by requests in flight)%s",
			what, amount(q.Spent), amount(q.Limit), unit, amount(q.Reserved), q.ResetNote())
	}
	return fmt.Sprintf("insufficient quota: this request may use up to %s%s (its prompt plus max_tokens, reserved in full before it runs), "+
		"more than the %s%s left of the tenant's %s of %s (%s spent, %s reserved by requests in flight)%s; lower max_tokens or raise the budget",
		amount(q.Requested), unit, amount(q.Left()), unit, what, amount(q.Limit), amount(q.Spent), amount(q.Reserved), q.ResetNote())
}

// errorHandler is echo's HTTPErrorHandler of the listener on: every error
// leaves in OpenAI's shape, never with a stack trace; a request no route
// takes is told what was meant.
func (s *Server) errorHandler(on side, err error, c echo.Context) {
	var ae *apierr.Error
	switch err {
	case echo.ErrNotFound: // echo's own answer when no route matched
		ae = s.errNoRoute(on, c)
	case echo.ErrMethodNotAllowed:
		ae = errMethodNotAllowed(c)
	default:
		ae = toAPIError(err, "")
	}
	if ae == errInternal {
		s.log.Error("request failed", "path", c.Path(), "err", err)
	}
	_ = apierr.Reply(c, ae)
}
