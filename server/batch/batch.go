package batch

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/apierr"
)

// Generator runs one generation request of a batch line as principal p and
// returns its whole answer (a line is never streamed). endpoint is the
// batch's, "/v1/chat/completions" or "/v1/completions"; body is the line's
// request body. When ctx ends before there is an answer, the answer is
// Cancelled. The gateway's server implements it with its request pipeline.
type Generator interface {
	Generate(ctx context.Context, p *policy.Principal, endpoint string, body []byte, line Line) Answer
}

// Line is how a Generator runs a batch line.
type Line struct {
	// IDPrefix starts the request id of every run of the line, so that
	// the ledger rows of its earlier runs can be found
	// ([data.Store.LineBilled]).
	IDPrefix string
	// Prepaid: an earlier run of the line was billed for an answer whose
	// result was lost (its gateway died between the two); this run's
	// tokens are not billed again.
	Prepaid bool
	// Group is the fan-out the line is a part of: its batch. The lines of
	// a batch in flight are hedged as one group (see router.Request.Group).
	Group string
}

// Answer is what a Generator answered a line.
type Answer struct {
	// Status is the HTTP status a client would have got: 200 with the
	// engine's JSON in Body, else an error in OpenAI's shape.
	Status int
	Body   []byte
	// RequestID is the gateway's id of the request (its ledger row).
	RequestID string
	// Code is the error's code ("" on success): it tells a rate limit
	// (rate_limit_exceeded) from a spent budget, both 429.
	Code string
	// RetryAfter is how long the client was asked to wait before trying
	// again; 0 when it was not.
	RetryAfter time.Duration
	// Cancelled: ctx ended the request before it had an answer; Status is 0
	// and nothing was billed. An answer that raced the cancellation counts.
	Cancelled bool
}

// Deps are the parts the Batch API works with; all are required unless
// said otherwise.
type Deps struct {
	// Store holds files, batches and their lines.
	Store *data.Store
	// Gate re-reads the principal of the key that created a batch, so a
	// revoked key stops it and changed limits apply.
	Gate *policy.Gate
	// Generator runs the lines.
	Generator Generator
	// Authenticate returns the caller of a Batch API request; its error is
	// answered through APIError.
	Authenticate func(echo.Context) (*policy.Principal, error)
	// APIError maps an error of a handler (or of Authenticate) to the one
	// the client sees: the gateway's error table. Errors this package
	// makes are *apierr.Error already.
	APIError func(error) *apierr.Error
	// Log receives the executor's progress and failures; nil discards.
	Log *slog.Logger
}

// Batches serves the Batch API and runs its batches.
type Batches struct {
	cfg      Config
	store    *data.Store
	gate     *policy.Gate
	gen      Generator
	auth     func(echo.Context) (*policy.Principal, error)
	apiError func(error) *apierr.Error
	log      *slog.Logger
	// wake tells the executor a batch was created or cancelled, so it
	// looks now rather than at its next PollInterval tick. One pending
	// wake-up is enough: the executor re-lists every unfinished batch.
	wake chan struct{}
}

// New returns the Batch API for cfg; with cfg.FilesDir empty it is off.
func New(cfg Config, d Deps) (*Batches, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.Store == nil || d.Gate == nil || d.Generator == nil || d.Authenticate == nil || d.APIError == nil {
		return nil, errors.New("batch: store, gate, generator, authenticate and api error are required")
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	return &Batches{cfg: cfg.withDefaults(), store: d.Store, gate: d.Gate, gen: d.Generator,
		auth: d.Authenticate, apiError: d.APIError, log: d.Log, wake: make(chan struct{}, 1)}, nil
}

// wakeExecutor asks the executor to look for new and cancelled batches now;
// it never blocks.
func (s *Batches) wakeExecutor() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}
