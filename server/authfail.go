package server

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/tailgate-dev/tailgate/policy"
)

// Why a request's credentials were refused: the bounded values of
// tailgate_auth_failures_total's reason label.
const (
	authMissing         = "missing"           // no bearer key (401)
	authInvalid         = "invalid"           // malformed or unknown key (401)
	authRevoked         = "revoked"           // a revoked key (401)
	authExpired         = "expired"           // an expired key (401)
	authModelNotAllowed = "model_not_allowed" // a key not allowed the model (403)
)

var authReasons = [...]string{authMissing, authInvalid, authRevoked, authExpired, authModelNotAllowed}

// authFailures counts refused credentials by reason and logs them with the
// key's display prefix at most — never the secret — about once every 10 s
// (as refused registrations are: a client retrying a bad key in a loop must
// not flood the log), saying how many lines it left out.
type authFailures struct {
	total [len(authReasons)]prometheus.Counter
	log   *slog.Logger
	every *rate.Limiter
	quiet atomic.Int64 // refusals not logged since the last line
}

// newAuthFailures registers tailgate_auth_failures_total with reg, every
// reason at 0 from the start (an alert on its rate has a series to read).
func newAuthFailures(reg prometheus.Registerer, log *slog.Logger) (*authFailures, error) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tailgate_auth_failures_total",
		Help: "Requests refused for their API key, by reason (missing, invalid, revoked, expired: 401; model_not_allowed: 403).",
	}, []string{"reason"})
	if err := reg.Register(vec); err != nil {
		return nil, fmt.Errorf("server: register metrics: %w", err)
	}
	a := &authFailures{log: log, every: rate.NewLimiter(rate.Every(10*time.Second), 3)}
	for i, r := range authReasons {
		a.total[i] = vec.WithLabelValues(r)
	}
	return a, nil
}

// authReason classifies a refusal of [policy.Gate.Authenticate]; "" for an
// error that is not about the key (the store could not be asked).
func authReason(err error) string {
	var exp *policy.ExpiredKeyError
	switch {
	case errors.As(err, &exp):
		return authExpired
	case errors.Is(err, policy.ErrRevokedKey):
		return authRevoked
	case errors.Is(err, policy.ErrInvalidKey):
		return authInvalid
	}
	return ""
}

// refused counts one refusal for reason and logs it unless the log's rate
// is spent. prefix is the key's display prefix ("" when the secret was
// missing or malformed); attrs say more (the client's address, the request
// id, the model).
func (a *authFailures) refused(reason, prefix string, attrs ...any) {
	i := slices.Index(authReasons[:], reason)
	if i < 0 {
		return
	}
	a.total[i].Inc()
	if !a.every.Allow() {
		a.quiet.Add(1)
		return
	}
	args := append([]any{"reason", reason}, attrs...)
	if prefix != "" {
		args = append(args, "key_prefix", prefix)
	}
	if n := a.quiet.Swap(0); n > 0 {
		args = append(args, "refused_since_last_log", n)
	}
	a.log.Warn("request refused for its API key", args...)
}

// refuseModel counts and logs a key refused the model it asked for (403).
func (s *Server) refuseModel(cl *call, model string) {
	s.auth.refused(authModelNotAllowed, cl.principal.KeyPrefix, "request_id", cl.id, "model", boundString(model))
}
