package server

import (
	"bytes"
	"context"
	"net/http"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/apierr"
	"github.com/tailgate-dev/tailgate/server/batch"
)

var _ batch.Generator = (*Server)(nil)

// Generate runs one request body of a batch line through the pipeline as p,
// on path (a batch's endpoint: /v1/chat/completions or /v1/completions), and
// returns the whole answer: it is the batch executor's way in, with a
// lineSink where the public API has its HTTP response.
func (s *Server) Generate(ctx context.Context, p *policy.Principal, path string, body []byte, line batch.Line) batch.Answer {
	var ep endpoint
	switch path {
	case chatEndpoint.path:
		ep = chatEndpoint
	case completionEndpoint.path:
		ep = completionEndpoint
	default:
		ae := apierr.BadRequest("endpoint", "a batch line cannot be sent to %s", path)
		return batch.Answer{Status: ae.Status, Body: ae.Body(), Code: ae.Code}
	}
	cl := s.newCall(ep, p)
	cl.id, cl.prepaid, cl.group, cl.batchLine = line.IDPrefix+cl.id, line.Prepaid, line.Group, true
	cl.priority = p.Class.Cap(policy.ClassBatch) // behind live traffic
	out := &lineSink{}
	s.serve(ctx, cl, body, out)
	return batch.Answer{Status: out.status, Body: out.body, RequestID: cl.id, Code: out.code,
		RetryAfter: out.retryAfter, Cancelled: out.status == 0}
}

// lineSink captures a batch line's answer.
type lineSink struct {
	status     int // 0 until answered: the client (the executor) went away first
	body       []byte
	code       string
	retryAfter time.Duration
}

func (o *lineSink) rateLimits(policy.RateState) {}
func (o *lineSink) stream(*call) *sseWriter     { return nil } // batch lines are never streamed
func (o *lineSink) json(_ *call, body []byte)   { o.status, o.body = http.StatusOK, bytes.Clone(body) }

func (o *lineSink) error(cl *call, ae *apierr.Error) {
	if cl.outcome == data.OutcomeClientCancelled {
		return
	}
	o.status, o.body, o.code, o.retryAfter = ae.Status, ae.Body(), ae.Code, ae.RetryAfter
}
