package server

import (
	"context"
	"errors"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/router"
)

// Answers the client sees only whole. A JSON answer is assembled from the
// engine's stream and nothing of it reaches the client before it is whole,
// so the router's call (router.Call.Whole) may race a pace hedge against an
// attempt that falls behind its model's decode pace and start one that
// broke once more elsewhere. The server only reads: assembleAttempt reads
// one attempt's answer and tells the router its progress and how it ended.

// assembleAttempt reads u's answer whole (see assembleJSON) into u.body,
// telling progress of each token after the first, and returns how it
// ended, as the router classifies it (see routerEnd).
func (s *Server) assembleAttempt(ctx context.Context, cl *call, u *upstream, progress func(int64, time.Time)) error {
	body, err := s.assembleJSON(ctx, cl, u, progress)
	u.body = body
	return routerEnd(err)
}

// routerEnd tells the router how an answer that had its first token ended:
// one that broke or went quiet is a router.ErrBroke (an idle one's replica
// is ejected; see router.Call.End and Call.Whole); any other failure — an
// error event, a deadline, the client going away — is the answer's own.
func routerEnd(err error) error {
	var me *midstreamError
	if errors.As(err, &me) {
		switch me.class {
		case data.ClassMidstream:
			return router.ErrBroke(err, false)
		case data.ClassIdleDeadline:
			return router.ErrBroke(err, true)
		}
	}
	return err
}
