package server

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"tailgate/policy"
	"tailgate/router"
)

// apiError is an error as OpenAI clients expect it:
// {"error":{"message","type","param","code"}} with a matching HTTP status.
type apiError struct {
	Status  int
	Type    string
	Code    string
	Param   string
	Message string
	// RetryAfter, when positive, is sent as the Retry-After header.
	RetryAfter time.Duration
}

func (e *apiError) Error() string { return e.Message }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_request", Param: param,
		Message: fmt.Sprintf(format, args...)}
}

var (
	errBodyTooLarge = &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
		Message: "request body is too large"}
	errBodyTimeout = &apiError{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Code: "request_timeout",
		Message: "the request body did not arrive in time"}
	errMissingKey = &apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
		Message: "missing API key: send it as 'Authorization: Bearer <key>'"}
	errBadKey = &apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
		Message: "invalid API key"}
	errBadAdminToken = &apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_admin_token",
		Message: "missing or invalid admin token"}
	errNoReplica = &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "no_replica",
		Message: "no replica is ready to serve this model; try again shortly", RetryAfter: time.Second}
	errUpstream = &apiError{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_error",
		Message: "the model replica failed to answer"}
	errUpstreamTimeout = &apiError{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "upstream_timeout",
		Message: "the model replica did not answer in time"}
	errInternal = &apiError{Status: http.StatusInternalServerError, Type: "server_error", Code: "internal_error",
		Message: "internal error"}
)

func errUnknownModel(model string) *apiError {
	return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found", Param: "model",
		Message: fmt.Sprintf("the model %q does not exist or is not served here", model)}
}

func errModelNotAllowed(model string) *apiError {
	return &apiError{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "model_not_allowed", Param: "model",
		Message: fmt.Sprintf("this API key may not use the model %q", model)}
}

// toAPIError maps any error of the request path to the one the client sees.
// This is the one table from error kind to HTTP status.
func toAPIError(err error, model string) *apiError {
	var (
		ae    *apiError
		limit *policy.LimitError
		quota *policy.QuotaError
		he    *echo.HTTPError
		mbe   *http.MaxBytesError
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
		return &apiError{Status: http.StatusTooManyRequests, Type: "requests", Code: "rate_limit_exceeded",
			Message:    fmt.Sprintf("rate limit exceeded (%s); retry after %s", kind, limit.RetryAfter.Round(time.Millisecond)),
			RetryAfter: retry}
	case errors.As(err, &quota):
		return &apiError{Status: http.StatusTooManyRequests, Type: "insufficient_quota", Code: "insufficient_quota",
			Message: "you exceeded your current quota: the tenant's budget is used up"}
	case errors.Is(err, policy.ErrInvalidKey):
		return errBadKey
	case errors.Is(err, policy.ErrModelNotAllowed):
		return errModelNotAllowed(model)
	case errors.Is(err, router.ErrUnknownModel):
		return errUnknownModel(model)
	case errors.Is(err, router.ErrNoReplica):
		return errNoReplica
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
		return &apiError{Status: he.Code, Type: typ, Code: "http_" + strconv.Itoa(he.Code), Message: msg}
	}
	return errInternal
}

// writeError sends e in OpenAI's shape unless the response is already committed.
func writeError(c echo.Context, e *apiError) error {
	if c.Response().Committed {
		return nil
	}
	if e.RetryAfter > 0 {
		secs := int64((e.RetryAfter + time.Second - 1) / time.Second)
		c.Response().Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	var param any
	if e.Param != "" {
		param = e.Param
	}
	return c.JSON(e.Status, map[string]any{"error": map[string]any{
		"message": e.Message, "type": e.Type, "param": param, "code": e.Code,
	}})
}

// errorHandler is echo's HTTPErrorHandler: every error leaves in OpenAI's shape,
// never with a stack trace.
func (s *Server) errorHandler(err error, c echo.Context) {
	ae := toAPIError(err, "")
	if ae == errInternal {
		s.log.Error("request failed", "path", c.Path(), "err", err)
	}
	_ = writeError(c, ae)
}
