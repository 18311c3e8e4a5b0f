package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/tracing"
)

const (
	// maxRequestBody bounds a generation request; the sidecar reads it whole
	// so the transport may resend it on a stale keep-alive connection.
	maxRequestBody = 32 << 20
	// maxEngineJSON bounds a non-streaming answer read from the engine.
	maxEngineJSON = 64 << 20
	// modelsTimeout bounds a model list request. Generation requests have no
	// deadline of the sidecar's: the client's (the gateway's TTFT and idle
	// deadlines) is the one that knows how long an answer may take.
	modelsTimeout = 10 * time.Second
)

func (s *Sidecar) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/chat/completions", s.handlePostGenerate)
	mux.HandleFunc("/v1/completions", s.handlePostGenerate)
	// The other endpoints vLLM serves, relayed the same way (the gateway
	// reads their usage).
	for _, p := range []string{"/v1/embeddings", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens", "/v1/rerank", "/rerank", "/v2/rerank",
		"/v1/score", "/score", "/tokenize", "/detokenize", "/v1/audio/transcriptions", "/v1/audio/translations"} {
		mux.HandleFunc(p, s.handlePostGenerate)
	}
	mux.HandleFunc("/v1/models", s.handleGetModels)
	mux.HandleFunc("/health", s.handleGetHealth)
	mux.HandleFunc("/sleep", s.handlePostSleep)
	mux.HandleFunc("/wake_up", s.handlePostWakeUp)
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { writeError(w, errNotFound) })
	return s.requireToken(mux)
}

// handlePostGenerate proxies a chat or text completion to the engine.
func (s *Sidecar) handlePostGenerate(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, errMethod)
		return
	}
	r, span := s.traced(r)
	defer endSpan(span)
	if aerr := s.admit(); aerr != nil {
		refused(span, aerr)
		writeError(w, aerr)
		return
	}
	defer s.done()

	body, aerr := readBody(w, r)
	if aerr != nil {
		refused(span, aerr)
		writeError(w, aerr)
		return
	}
	resp, wroteAt, err := s.post(r, body)
	answered(span, resp, err)
	if err != nil {
		s.engineFailed(w, r, err)
		return
	}
	defer resp.Body.Close()

	switch {
	case resp.StatusCode != http.StatusOK:
		relayAsIs(w, resp)
	case isEventStream(resp.Header):
		s.relayStream(w, r, resp, wroteAt)
	default:
		s.relayJSON(w, r, resp, wroteAt)
	}
}

// post sends the client's request to the engine and returns its answer and
// when the request was written. The request carries an idempotency key (the
// gateway's, or one of its own), which lets the transport send it once more
// on a new connection when it failed on a kept-alive one before any byte of
// an answer came back: the engine closed the idle connection as the request
// arrived (vLLM closes idle connections after VLLM_HTTP_TIMEOUT_KEEP_ALIVE),
// so it never read it. Without a key the transport resends no POST it has
// written; with one it resends nothing the engine began to answer.
func (s *Sidecar) post(r *http.Request, body []byte) (*http.Response, time.Time, error) {
	tr := newWroteTrace()
	ctx := httptrace.WithClientTrace(r.Context(), tr.clientTrace())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.engineURL(r), bytes.NewReader(body))
	if err != nil {
		return nil, time.Time{}, err
	}
	copyRequestHeader(req.Header, r.Header)
	if s.tracer != nil {
		tracing.Inject(r.Context(), req.Header) // the engine continues the sidecar's span
	}
	if req.Header.Get(idempotencyKey) == "" {
		req.Header.Set(idempotencyKey, "sidecar-"+strconv.FormatUint(requestSeq.Add(1), 36))
	}
	s.authorize(req)
	resp, err := s.transport.RoundTrip(req)
	if err != nil {
		return nil, time.Time{}, err
	}
	return resp, tr.wroteAt(), nil
}

// idempotencyKey is the header that makes the transport replay a POST
// that died unanswered on a kept-alive connection (hop.Transport, as
// net/http's Request.isReplayable).
const idempotencyKey = "X-Idempotency-Key"

// requestSeq numbers the idempotency keys the sidecar makes itself.
var requestSeq atomic.Uint64

// handleGetModels proxies the engine's model list.
func (s *Sidecar) handleGetModels(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", http.MethodGet)
		writeError(w, errMethod)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), modelsTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, r.Method, s.engineURL(r), nil)
	if err != nil {
		s.engineFailed(w, r, err)
		return
	}
	copyRequestHeader(req.Header, r.Header)
	s.authorize(req)
	resp, err := s.transport.RoundTrip(req)
	if err != nil {
		s.engineFailed(w, r, err)
		return
	}
	defer resp.Body.Close()
	relayAsIs(w, resp)
}

// handleGetHealth answers 200 {"state":"ready"} while the replica serves,
// else 503 with the state and the reason.
func (s *Sidecar) handleGetHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", http.MethodGet)
		writeError(w, errMethod)
		return
	}
	state, reason, ready := s.health()
	body, _ := json.Marshal(struct {
		State  string `json:"state"`
		Reason string `json:"reason,omitempty"`
	}{state, reason})
	status := http.StatusOK
	if !ready {
		status = http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// authorize adds the engine's API key to req, a request to the engine. The
// client's own Authorization (the cluster token) never reaches the engine.
func (s *Sidecar) authorize(req *http.Request) {
	if s.cfg.EngineKey == nil {
		return
	}
	if key := s.cfg.EngineKey(); key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
}

func (s *Sidecar) engineURL(r *http.Request) string {
	u := s.cfg.EngineURL() + r.URL.Path
	if r.URL.RawQuery != "" {
		u += "?" + r.URL.RawQuery
	}
	return u
}

// engineFailed answers a request the engine did not answer. A client that
// went away gets nothing; an engine that could not be dialled (restarting,
// not up yet) is "unavailable", so the gateway may try elsewhere at once.
func (s *Sidecar) engineFailed(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return
	}
	if op, ok := errors.AsType[*net.OpError](err); ok && op.Op == "dial" {
		s.log.Warn("engine unreachable", "path", r.URL.Path, "err", err)
		writeError(w, errEngineUnavailable)
		return
	}
	s.log.Warn("engine request failed", "path", r.URL.Path, "err", err)
	writeError(w, errEngine)
}

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	body, err := serving.ReadBody(w, r, maxRequestBody)
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, errBodyTooLarge
		}
		return nil, errBadBody
	}
	return body, nil
}

// relayJSON relays a non-streaming answer byte for byte, adding the engine's
// time (request written → answer complete: for a JSON answer the first token
// is visible only then) and, when the engine told it, the queue time.
func (s *Sidecar) relayJSON(w http.ResponseWriter, r *http.Request, resp *http.Response, wroteAt time.Time) {
	var buf bytes.Buffer
	if n := resp.ContentLength; n > 0 && n <= maxEngineJSON {
		buf.Grow(int(n))
	}
	_, err := buf.ReadFrom(io.LimitReader(resp.Body, maxEngineJSON+1))
	if err == nil && buf.Len() > maxEngineJSON {
		err = errors.New("answer too large")
	}
	if err != nil {
		if r.Context().Err() == nil {
			s.log.Warn("read engine answer", "path", r.URL.Path, "err", err)
			writeError(w, errEngine)
		}
		return
	}
	ttft := time.Since(wroteAt)
	s.ttft.add(ttft)
	q, haveQ := simQueue(resp.Header)
	traceTTFT(r, ttft, q, haveQ)

	h := w.Header()
	copyResponseHeader(h, resp.Header)
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	h.Set(serving.HeaderEngineTTFT, string(appendMillis(nil, ttft)))
	if haveQ {
		h.Set(serving.HeaderEngineQueue, string(appendMillis(nil, q)))
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(buf.Bytes())
}

// relayAsIs relays an answer the sidecar does not time: errors of the engine
// and the model list.
func relayAsIs(w http.ResponseWriter, resp *http.Response) {
	copyResponseHeader(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

func isEventStream(h http.Header) bool {
	ct := h.Get("Content-Type")
	return len(ct) >= len("text/event-stream") && ct[:len("text/event-stream")] == "text/event-stream"
}

// simQueue returns the simulated engine's queue-time header.
func simQueue(h http.Header) (time.Duration, bool) {
	v := h.Get(serving.HeaderSimQueue)
	if v == "" {
		return 0, false
	}
	return parseMillis(v)
}

func parseMillis(v string) (time.Duration, bool) {
	ms, err := strconv.ParseFloat(v, 64)
	if err != nil || ms < 0 || ms > 1e12 {
		return 0, false
	}
	return time.Duration(ms * float64(time.Millisecond)), true
}

// appendMillis appends d in milliseconds with three decimals, the wire
// format of the timing report.
func appendMillis(b []byte, d time.Duration) []byte {
	return strconv.AppendFloat(b, float64(d)/float64(time.Millisecond), 'f', 3, 64)
}

// hopHeaders are meaningful for one connection only (RFC 9110 §7.6.1).
var hopHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// copyRequestHeader copies the client's headers for the engine, less the
// hop-by-hop ones, the cluster token (the engine must never see it), and
// Accept-Encoding (the answer must come uncompressed to be read).
func copyRequestHeader(dst, src http.Header) {
	for k, vv := range src {
		dst[k] = vv
	}
	for _, k := range hopHeaders {
		dst.Del(k)
	}
	dst.Del("Authorization")
	dst.Del("Accept-Encoding")
	dst.Del("Content-Length")
}

// copyResponseHeader copies the engine's headers for the client, less the
// hop-by-hop ones and the simulator's queue time, which the timing report
// carries instead.
func copyResponseHeader(dst, src http.Header) {
	for k, vv := range src {
		dst[k] = vv
	}
	for _, k := range hopHeaders {
		dst.Del(k)
	}
	dst.Del(serving.HeaderSimQueue)
}

// wroteTrace records when the request was fully written to the engine, as an
// offset from a base time so the monotonic clock is kept. A replayed
// request's time is its last write.
type wroteTrace struct {
	base  time.Time
	wrote atomic.Int64 // nanoseconds after base; 0 until written
}

func newWroteTrace() *wroteTrace { return &wroteTrace{base: time.Now()} }

func (t *wroteTrace) clientTrace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				t.wrote.Store(max(int64(time.Since(t.base)), 1))
			}
		},
	}
}

// wroteAt returns when the request was written; the base time if the trace
// never said.
func (t *wroteTrace) wroteAt() time.Time {
	return t.base.Add(time.Duration(t.wrote.Load()))
}
