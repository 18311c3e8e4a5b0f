package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/server/apierr"
)

// Idempotency-Key, as Stripe defines it (docs/api.md, "Idempotent
// requests"): a generating request sent with the header is recorded under
// its tenant and key. A retry with the same key and the same request within
// the retention window gets the recorded answer — the same id, the same
// content, Idempotent-Replayed: true — from the record, without a second
// run and billed 0 (its own ledger row, replay_of naming the original). The
// same key with another request is a 422. A retry that arrives while the
// first still runs waits for its answer (JSON) or joins its stream. A keyed
// request is not cancelled when its client goes away: it runs on, within
// Config.IdempotencyAbandon with nobody reading it, so the retry finds it
// running or done.
//
// What a request asked is the SHA-256 of its endpoint and its body as the
// client sent it (a multipart body without its boundary, which clients draw
// anew for each request): the raw bytes, not the body the gateway forwards,
// so gateways with different defaults agree on what a retry is.
//
// Requests without the header take one header lookup of this (generate.go).

// idemHeader is the request header; idemReplayed the response header a
// replayed answer carries (Stripe's name).
const (
	idemHeader   = "Idempotency-Key"
	idemReplayed = "Idempotent-Replayed"
	// idemOriginal names the request whose answer a replay is.
	idemOriginal = "X-Tailgate-Replay-Of"
	// maxIdemKey bounds a key's length, as Stripe's 255 characters.
	maxIdemKey = 255
	// idemPoll is how often a retry looks at a record another gateway is
	// running.
	idemPoll = 50 * time.Millisecond
	// idemSweepEvery is how often expired records are removed and tenants
	// held to their count.
	idemSweepEvery = time.Minute
)

// Defaults of the Idempotency-Key settings (Config).
const (
	DefaultIdempotencyRetention = 24 * time.Hour
	DefaultIdempotencyMaxBytes  = 1 << 20
	DefaultIdempotencyMaxKeys   = 10000
	DefaultIdempotencyAbandon   = time.Minute
)

// keyedEndpoint reports whether ep honours Idempotency-Key: every endpoint
// that runs a model; tokenizing is free and has nothing to bill twice.
func keyedEndpoint(ep endpoint) bool {
	switch ep.path {
	case "/tokenize", "/detokenize", "/v1/messages/count_tokens":
		return false
	}
	return true
}

// idemKey names a record: keys are the tenant's own.
type idemKey struct {
	tenant int64
	key    string
}

// flight is a keyed request this gateway runs (or is claiming: ready is
// open): retries that arrive meanwhile wait for it or join it.
type flight struct {
	fp    string
	ready chan struct{} // closed once claimed (log set) or given up (log nil)
	id    string        // the request that runs it
	log   *answerLog

	mu      sync.Mutex
	readers int         // clients reading its answer
	cancel  func()      // cancels the run
	abandon *time.Timer // cancels the run once nobody read it for a while
}

// flights are the keyed requests this gateway runs.
type flights struct {
	mu sync.Mutex
	m  map[idemKey]*flight
}

// attach counts a client reading the answer; detach the client leaving,
// which starts the abandon timer when it was the last one.
func (f *flight) attach() {
	f.mu.Lock()
	f.readers++
	if f.abandon != nil {
		f.abandon.Stop()
	}
	f.mu.Unlock()
}

func (s *Server) detach(f *flight) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.readers--; f.readers > 0 || f.cancel == nil {
		return
	}
	if f.abandon == nil {
		f.abandon = time.AfterFunc(s.cfg.IdempotencyAbandon, f.cancel)
	} else {
		f.abandon.Reset(s.cfg.IdempotencyAbandon)
	}
}

// fingerprint is what a keyed request asked: its endpoint and its body as
// sent, a multipart body without its boundary.
func fingerprint(ep endpoint, ctype string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(ep.path))
	h.Write([]byte{0})
	if ep.form {
		if _, params, err := mime.ParseMediaType(ctype); err == nil && params["boundary"] != "" {
			hashWithout(h, body, []byte(params["boundary"]))
			return hex.EncodeToString(h.Sum(nil))
		}
	}
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// hashWithout writes body to h with every occurrence of cut left out.
func hashWithout(h interface{ Write([]byte) (int, error) }, body, cut []byte) {
	for {
		i := bytes.Index(body, cut)
		if i < 0 {
			h.Write(body)
			return
		}
		h.Write(body[:i])
		body = body[i+len(cut):]
	}
}

func validIdemKey(k string) bool {
	if len(k) > maxIdemKey {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

func errIdemReused(key string, retention time.Duration) *apierr.Error {
	return &apierr.Error{Status: http.StatusUnprocessableEntity, Type: "invalid_request_error", Code: "idempotency_key_reused", Param: idemHeader,
		Message: "Idempotency-Key " + strconv.Quote(key) + " was used for a different request (another endpoint or body) within the last " +
			retention.String() + "; send a new key for a new request"}
}

var (
	errIdemUnkept = &apierr.Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "idempotency_answer_not_kept", Param: idemHeader,
		Message: "the request with this Idempotency-Key was answered, but its answer was larger than the gateway keeps, so it cannot be sent again; send a new key to run it again"}
	errIdemCancelled = &apierr.Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "idempotency_request_cancelled", Param: idemHeader,
		Message: "the request with this Idempotency-Key was cancelled before it was answered; retry it"}
)

// serveKeyed serves a request that carries an Idempotency-Key: it claims
// the key and runs the request, or gives the answer of the request that
// claimed it (waiting for it, or joining its stream, while it runs).
func (s *Server) serveKeyed(c echo.Context, cl *call, key string, body []byte, out *httpSink) {
	r := c.Request()
	if !validIdemKey(key) {
		s.reject(cl, out, apierr.BadRequest(idemHeader, "Idempotency-Key must be 1 to %d printable ASCII characters", maxIdemKey))
		return
	}
	if err := s.ledger.Healthy(); err != nil {
		s.reject(cl, out, err)
		return
	}
	k := idemKey{cl.principal.TenantID, key}
	fp := fingerprint(cl.ep, cl.ctype, body)
	ctx := r.Context()
	for {
		s.idem.mu.Lock()
		f := s.idem.m[k]
		if f == nil {
			f = &flight{fp: fp, ready: make(chan struct{})}
			if s.idem.m == nil {
				s.idem.m = make(map[idemKey]*flight)
			}
			s.idem.m[k] = f
			s.idem.mu.Unlock()
			if s.claimKeyed(c, cl, k, f, body, out) {
				return
			}
			continue
		}
		s.idem.mu.Unlock()
		select {
		case <-f.ready:
		case <-ctx.Done():
			s.reject(cl, out, ctx.Err())
			return
		}
		if f.log == nil {
			continue // its claim found a record: look again
		}
		if f.fp != fp {
			s.reject(cl, out, errIdemReused(key, s.cfg.IdempotencyRetention))
			return
		}
		s.replay(c, cl, f.log, f.id, f)
		return
	}
}

// claimKeyed claims k in the database for f, the flight this request put in
// the map, and runs the request if it got the key; otherwise it answers
// from the record it found (or waits for it). false means look again: the
// record went away meanwhile.
func (s *Server) claimKeyed(c echo.Context, cl *call, k idemKey, f *flight, body []byte, out *httpSink) bool {
	ctx := c.Request().Context()
	giveUp := func() {
		s.idem.mu.Lock()
		delete(s.idem.m, k)
		s.idem.mu.Unlock()
		close(f.ready)
	}
	now := time.Now()
	rec := data.IdemRecord{TenantID: k.tenant, Key: k.key, Fingerprint: f.fp, RequestID: cl.id,
		Created: now, Expires: now.Add(s.cfg.IdempotencyRetention)}
	for {
		got, claimed, err := s.store.ClaimIdempotency(ctx, rec)
		if err != nil {
			giveUp()
			s.log.Warn("idempotency key not claimed", "request_id", cl.id, "err", err)
			s.reject(cl, out, errLedgerUnavailable)
			return true
		}
		if claimed {
			s.runKeyed(c, cl, k, f, body)
			return true
		}
		if got.Fingerprint != f.fp {
			giveUp()
			s.reject(cl, out, errIdemReused(k.key, s.cfg.IdempotencyRetention))
			return true
		}
		switch got.State {
		case data.IdemDone:
			giveUp()
			s.replay(c, cl, recordLog(got), got.RequestID, nil)
			return true
		case data.IdemUnkept:
			giveUp()
			s.reject(cl, out, errIdemUnkept)
			return true
		}
		// Pending: another gateway runs it, or a gateway that died did.
		alive, err := s.store.IdemOwnerAlive(ctx, got.Owner)
		if err != nil {
			giveUp()
			s.reject(cl, out, errLedgerUnavailable)
			return true
		}
		if !alive {
			ok, err := s.store.TakeOverIdempotency(ctx, k.tenant, k.key, got.RequestID, cl.id)
			if err != nil {
				giveUp()
				s.reject(cl, out, errLedgerUnavailable)
				return true
			}
			if ok {
				// The dead run's row bills what it delivered: this run
				// is not billed again if that was anything.
				billed, err := s.store.BilledTokens(ctx, got.RequestID)
				if err != nil {
					s.log.Warn("idempotency: the interrupted request's bill is unknown; this run is billed", "request_id", cl.id, "err", err)
				}
				cl.prepaid, cl.replayOf = billed > 0, got.RequestID
				s.runKeyed(c, cl, k, f, body)
				return true
			}
			continue
		}
		// Another live gateway runs it: look again shortly.
		select {
		case <-time.After(idemPoll):
		case <-ctx.Done():
			giveUp()
			s.reject(cl, out, ctx.Err())
			return true
		}
	}
}

// runKeyed runs the request whose key it claimed: the pipeline records the
// answer into the flight's log, which the client (and any retry that
// joins) reads from; the run is detached from the client, and cancelled
// only once nobody read it for Config.IdempotencyAbandon. A whole answer
// is kept as the key's record; any other ending gives the key up, so a
// retry runs the request again.
func (s *Server) runKeyed(c echo.Context, cl *call, k idemKey, f *flight, body []byte) {
	log := newAnswerLog(cl.id)
	f.id, f.log = cl.id, log
	ctx, cancel := context.WithCancel(context.WithoutCancel(c.Request().Context()))
	defer cancel()
	f.mu.Lock()
	f.cancel = cancel
	f.mu.Unlock()
	close(f.ready)

	f.attach()
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer s.detach(f)
		_ = s.deliver(c, log, lastEventSeq(c.Request(), cl.id), false)
	}()
	var rw http.ResponseWriter = log
	if isMessagesPath(cl.ep.path) {
		rw = apierr.Anthropic(log)
	}
	s.serve(ctx, cl, body, newRecordSink(s, rw))
	log.finish()
	f.mu.Lock()
	if f.abandon != nil {
		f.abandon.Stop()
	}
	f.mu.Unlock()
	s.keep(cl, k, log)
	s.idem.mu.Lock()
	delete(s.idem.m, k)
	s.idem.mu.Unlock()
	<-read
}

// keep stores a whole answer as k's record (within the bound on what is
// kept), or gives k up if the request was not answered whole.
func (s *Server) keep(cl *call, k idemKey, log *answerLog) {
	ctx := context.Background()
	status, ctype, body := log.whole()
	var err error
	if cl.outcome == data.OutcomeOK && status == http.StatusOK {
		if int64(len(body)) > s.cfg.IdempotencyMaxBytes {
			body = nil
		} else if body == nil {
			body = []byte{}
		}
		err = s.store.FinishIdempotency(ctx, k.tenant, k.key, cl.id, log.modelName(), status, ctype, body)
	} else {
		err = s.store.ReleaseIdempotency(ctx, k.tenant, k.key, cl.id)
	}
	if err != nil {
		s.log.Warn("idempotency record not updated", "request_id", cl.id, "err", err)
	}
}

// replay gives this request the answer of request orig, from log (a
// flight's, which may still be running, or a record's), with its own
// ledger row billed 0.
func (s *Server) replay(c echo.Context, cl *call, log *answerLog, orig string, f *flight) {
	cl.outcome, cl.status = data.OutcomeOK, http.StatusOK
	cl.stages.Total = time.Since(cl.start)
	row := data.LedgerRow{ID: cl.id, Time: cl.start, TenantID: cl.principal.TenantID, KeyID: cl.principal.KeyID,
		Model: boundString(log.modelName()), Stream: log.isStream(), Status: http.StatusOK, Outcome: data.OutcomeOK,
		Stages: cl.stages, Priority: cl.priority.String(), QueueWait: -1, Endpoint: cl.ep.path, ReplayOf: orig}
	if err := s.ledger.Commit(context.Background(), row); err != nil && errors.Is(err, data.ErrLedgerUnavailable) {
		cl.recorded = true
		_ = apierr.Reply(c, errLedgerUnavailable)
		return
	}
	cl.recorded = true
	if f != nil {
		f.attach()
		defer s.detach(f)
	}
	_ = s.deliver(c, log, lastEventSeq(c.Request(), orig), true)
}

// lastEventSeq is the sequence number of the last event of stream id the
// client has (its Last-Event-ID, "<id>:<seq>"), 0 for none.
func lastEventSeq(r *http.Request, id string) int {
	v := r.Header.Get("Last-Event-ID")
	if len(v) <= len(id)+1 || v[:len(id)] != id || v[len(id)] != ':' {
		return 0
	}
	n, err := strconv.Atoi(v[len(id)+1:])
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// RunIdempotency removes expired Idempotency-Key records, and each tenant's
// oldest beyond Config.IdempotencyMaxKeys, every minute until ctx ends;
// then it cancels the keyed runs nobody reads.
func (s *Server) RunIdempotency(ctx context.Context) error {
	t := time.NewTicker(idemSweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.idem.mu.Lock()
			for _, f := range s.idem.m {
				f.mu.Lock()
				if f.readers == 0 && f.cancel != nil {
					f.cancel()
				}
				f.mu.Unlock()
			}
			s.idem.mu.Unlock()
			return nil
		case now := <-t.C:
			if n, err := s.store.SweepIdempotency(ctx, now, s.cfg.IdempotencyMaxKeys); err != nil {
				s.log.Warn("idempotency records not swept", "err", err)
			} else if n > 0 {
				s.log.Debug("idempotency records swept", "removed", n)
			}
		}
	}
}
