package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/tidwall/gjson"

	"tailgate/router"
	"tailgate/serving"
)

// maxUpstreamBody bounds a non-streaming answer read from a replica.
const maxUpstreamBody = 64 << 20

// upstreamError is a failure after the request reached the replica.
type upstreamError struct {
	status int // upstream HTTP status, 0 for a transport error
	err    error
}

func (e *upstreamError) Error() string {
	if e.status != 0 {
		return fmt.Sprintf("upstream status %d: %v", e.status, e.err)
	}
	return "upstream: " + e.err.Error()
}
func (e *upstreamError) Unwrap() error { return e.err }

// attemptTrace records, through httptrace, how far an attempt got.
type attemptTrace struct {
	connectStart atomic.Int64
	connectDone  atomic.Int64
	wrote        atomic.Int64 // unix nanos when the request was fully written
}

func (t *attemptTrace) clientTrace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		ConnectStart: func(string, string) { t.connectStart.Store(time.Now().UnixNano()) },
		ConnectDone:  func(string, string, error) { t.connectDone.Store(time.Now().UnixNano()) },
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				t.wrote.Store(time.Now().UnixNano())
			}
		},
	}
}

// attempt sends the call to rep and relays the answer to the client.
func (s *Server) attempt(ctx context.Context, c echo.Context, cl *call, rep *router.Replica, n int) error {
	if n == 1 {
		cl.mm.first.Inc()
	} else {
		cl.mm.retry.Inc()
	}
	tr := &attemptTrace{}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, tr.clientTrace()),
		http.MethodPost, rep.URL+cl.ep.path, bytes.NewReader(cl.req.body))
	if err != nil {
		return router.ErrNotSent(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", cl.id)
	if !rep.Static && s.cfg.ClusterToken != "" {
		req.Header.Set("Authorization", "Bearer "+s.cfg.ClusterToken)
	}
	if cl.req.stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	sendAt := time.Now()
	if cl.stages.Gateway < 0 {
		cl.stages.Gateway = sendAt.Sub(cl.start)
	}
	resp, err := s.transport.RoundTrip(req)
	if err != nil {
		if tr.wrote.Load() == 0 {
			return router.ErrNotSent(err)
		}
		return &upstreamError{err: err}
	}
	defer resp.Body.Close()
	cl.replica = rep.ID
	if cs, cd := tr.connectStart.Load(), tr.connectDone.Load(); cs != 0 && cd >= cs {
		cl.stages.Connect = time.Duration(cd - cs)
	} else {
		cl.stages.Connect = 0 // a warm connection was reused
	}
	wroteAt := sendAt
	if w := tr.wrote.Load(); w != 0 {
		wroteAt = time.Unix(0, w)
	}

	if resp.StatusCode != http.StatusOK {
		return s.relayUpstreamError(c, cl, resp)
	}
	if cl.req.stream {
		return s.relayStream(ctx, c, cl, resp, wroteAt)
	}
	return s.relayJSON(c, cl, resp, wroteAt)
}

// relayJSON relays a non-streaming answer byte for byte.
func (s *Server) relayJSON(c echo.Context, cl *call, resp *http.Response, wroteAt time.Time) error {
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxUpstreamBody))
	if err != nil {
		return &upstreamError{err: err}
	}
	now := time.Now()
	cl.stages.UpstreamTTFT = now.Sub(wroteAt)
	if v, ok := parseMillis(resp.Header.Get(serving.HeaderEngineTTFT)); ok {
		cl.stages.EngineTTFT = v
		cl.stages.Network = max(cl.stages.UpstreamTTFT-v, 0)
	}
	if v, ok := parseMillis(resp.Header.Get(serving.HeaderEngineQueue)); ok {
		cl.stages.EngineQueue = v
	}
	if u := gjson.GetBytes(body, "usage"); u.IsObject() {
		cl.usage.PromptTokens = u.Get("prompt_tokens").Int()
		cl.usage.CompletionTokens = u.Get("completion_tokens").Int()
		cl.gotUsage = true
	}
	cl.stages.TTFT = now.Sub(cl.start)
	cl.stages.Total = cl.stages.TTFT
	cl.firstToken = true
	h := c.Response().Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	s.setRouteHeaders(h, cl)
	h.Set("Server-Timing", serverTiming(cl))
	c.Response().WriteHeader(http.StatusOK)
	_, _ = c.Response().Write(body)
	return nil
}

// relayUpstreamError passes a replica's client error (4xx but 429) through as
// it is — it speaks OpenAI's shape already — and turns overload and server
// errors into the gateway's own 502/503.
func (s *Server) relayUpstreamError(c echo.Context, cl *call, resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests {
		cl.status = resp.StatusCode
		cl.outcome = "upstream_rejected"
		cl.errClass = "upstream_" + strconv.Itoa(resp.StatusCode)
		h := c.Response().Header()
		h.Set("Content-Type", "application/json")
		s.setRouteHeaders(h, cl)
		if !gjson.ValidBytes(body) || !gjson.GetBytes(body, "error").Exists() {
			return writeError(c, &apiError{Status: resp.StatusCode, Type: "invalid_request_error",
				Code: "upstream_rejected", Message: strings.TrimSpace(string(body))})
		}
		return c.Blob(resp.StatusCode, "application/json", body)
	}
	err := &upstreamError{status: resp.StatusCode, err: fmt.Errorf("%s", http.StatusText(resp.StatusCode))}
	if resp.StatusCode == http.StatusServiceUnavailable {
		switch gjson.GetBytes(body, "error.code").String() {
		case "replica_draining":
			// The worker is going away; its heartbeat will say so too.
			if rep := s.reg.Get(cl.replica); rep != nil && rep.State() == router.StateReady {
				rep.SetState(router.StateDraining, "draining (told by the replica)")
			}
			return router.ErrDeclined(err)
		case "replica_not_ready":
			return router.ErrDeclined(err)
		}
	}
	return err
}

func (s *Server) setRouteHeaders(h http.Header, cl *call) {
	if cl.replica != "" {
		h.Set("X-Tailgate-Replica", cl.replica)
	}
	h.Set("X-Tailgate-Attempts", strconv.Itoa(max(cl.attempts, 1)))
}

// serverTiming renders the call's known stages as a Server-Timing header, in
// milliseconds.
func serverTiming(cl *call) string {
	st := cl.stages
	var b []byte
	for i, d := range [8]time.Duration{st.Gateway, st.Connect, st.UpstreamTTFT, st.EngineQueue, st.EngineTTFT, st.Network, st.TTFT, st.Total} {
		if d < 0 {
			continue
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = append(b, stageNames[i]...)
		b = append(b, ";dur="...)
		b = strconv.AppendFloat(b, float64(d)/float64(time.Millisecond), 'f', 3, 64)
	}
	return string(b)
}

// parseMillis parses a decimal number of milliseconds.
func parseMillis(v string) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || f > 1e9 {
		return 0, false
	}
	return time.Duration(f * float64(time.Millisecond)), true
}

// parseTiming reads the sidecar's SSE timing comment
// (": tailgate-timing engine_ttft_ms=12.3 engine_queue_ms=0.2").
func parseTiming(cl *call, comment []byte) {
	for _, f := range strings.Fields(string(comment[len(serving.TimingComment):])) {
		k, v, _ := strings.Cut(f, "=")
		d, ok := parseMillis(v)
		if !ok {
			continue
		}
		switch k {
		case "engine_ttft_ms":
			cl.stages.EngineTTFT = d
		case "engine_queue_ms":
			cl.stages.EngineQueue = d
		}
	}
}
