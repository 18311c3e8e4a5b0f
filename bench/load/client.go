package load

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Error classes a request can end with.
const (
	ErrConnect     = "connect"      // the connection could not be made
	ErrTimeout     = "timeout"      // the per-request deadline passed
	ErrTransport   = "transport"    // the connection broke before a response
	ErrStreamCut   = "stream_cut"   // the stream ended before [DONE]
	ErrStreamError = "stream_error" // an in-band error event
	ErrBadBody     = "bad_body"     // a 200 whose body is not an answer
	ErrAborted     = "aborted"      // the run was stopped (Ctrl-C)
	ErrOverload    = "client_overload"
)

// newHTTPClient returns the bench's client: keep-alive on unless disabled,
// no compression (streams must arrive as sent), no overall timeout (each
// request has its own deadline).
func newHTTPClient(disableKeepAlive bool, maxConns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        8192,
		MaxIdleConnsPerHost: 8192,
		MaxConnsPerHost:     maxConns,
		IdleConnTimeout:     90 * time.Second,
		DisableKeepAlives:   disableKeepAlive,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}}
}

// sender sends requests to one target and measures them.
type sender struct {
	client  *http.Client
	bases   []string // each ends in /v1, no trailing slash; request i goes to bases[i%len]
	key     string
	timeout time.Duration
	start   time.Time // the run's start
}

// send sends req and fills rec. intended is the intended send time.
func (s *sender) send(ctx context.Context, req Request, intended time.Time, rec *Record) {
	rec.Index, rec.Stream, rec.Source = req.Index, req.Stream, req.Source
	rec.PromptTokens, rec.MaxTokens = req.PromptTokens, req.MaxTokens
	rec.Intended = intended.Sub(s.start)
	rec.TTFT, rec.Total, rec.LastToken = -1, -1, -1
	since := func() time.Duration { return time.Since(intended) }

	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	// The transport may call these from its dialing goroutine, even after
	// Do returned (a dial started for this request can serve another).
	var connStart, connDone atomic.Int64
	trace := &httptrace.ClientTrace{
		ConnectStart: func(string, string) { connStart.CompareAndSwap(0, time.Now().UnixNano()) },
		ConnectDone:  func(string, string, error) { connDone.CompareAndSwap(0, time.Now().UnixNano()) },
	}
	hreq, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost, s.bases[req.Index%len(s.bases)]+req.Path, bytes.NewReader(req.Body))
	if err != nil {
		rec.Sent = time.Since(s.start)
		rec.fail(ErrTransport, BeforeFirstToken, since())
		return
	}
	hreq.Header.Set("Content-Type", "application/json")
	if s.key != "" {
		hreq.Header.Set("Authorization", "Bearer "+s.key)
	}
	if req.Stream {
		hreq.Header.Set("Accept", "text/event-stream")
	}
	if req.Source != "" {
		hreq.Header.Set("X-Tailgate-Source", req.Source)
	}
	rec.Sent = time.Since(s.start)
	resp, err := s.client.Do(hreq)
	if err != nil {
		rec.fail(classify(ctx, err), BeforeFirstToken, since())
		return
	}
	defer resp.Body.Close()
	if cs, cd := connStart.Load(), connDone.Load(); cs != 0 && cd >= cs {
		rec.stage(ClientConnect, time.Duration(cd-cs))
	} else {
		rec.stage(ClientConnect, 0)
	}
	rec.Status = resp.StatusCode
	rec.RequestID = resp.Header.Get("X-Request-Id")
	rec.Replica = resp.Header.Get("X-Tailgate-Replica")
	rec.Attempts, _ = strconv.Atoi(resp.Header.Get("X-Tailgate-Attempts"))
	parseServerTiming(rec, resp.Header.Get("Server-Timing"))

	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		rec.ErrCode = errorCode(body)
		rec.fail("http_"+strconv.Itoa(resp.StatusCode), BeforeFirstToken, since())
		return
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		s.readStream(ctx, resp.Body, intended, rec)
		return
	}
	rec.TTFT = since()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		rec.TTFT = -1
		rec.fail(classify(ctx, err), BeforeFirstToken, since())
		return
	}
	rec.Total = since()
	var ans struct {
		Usage *struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
		Error   json.RawMessage `json:"error"`
		Choices []json.RawMessage
	}
	if json.Unmarshal(body, &ans) != nil || ans.Error != nil || len(ans.Choices) == 0 {
		rec.ErrCode = errorCode(body)
		rec.TTFT = -1
		rec.fail(ErrBadBody, BeforeFirstToken, rec.Total)
		return
	}
	rec.Chunks = 1
	if ans.Usage != nil {
		rec.Completion = ans.Usage.CompletionTokens
	}
}

var (
	contentKey = []byte(`"content":"`)
	textKey    = []byte(`"text":"`)
	usageKey   = []byte(`"usage":{`)
	doneData   = []byte("[DONE]")
)

// readStream reads an SSE answer, timing each content chunk.
func (s *sender) readStream(ctx context.Context, body io.Reader, intended time.Time, rec *Record) {
	br := bufio.NewReaderSize(body, 16<<10)
	var last time.Time
	stage := func() string {
		if rec.Chunks > 0 {
			return Midstream
		}
		return BeforeFirstToken
	}
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// An event line longer than the buffer: keep the start (where the
			// markers are) and skip the rest.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
		}
		if err != nil {
			class := ErrStreamCut
			if ctx.Err() != nil {
				class = classify(ctx, ctx.Err())
			}
			rec.fail(class, stage(), time.Since(intended))
			return
		}
		payload, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:"))
		if !ok {
			continue // blank line, comment, event or id field
		}
		payload = bytes.TrimSpace(payload)
		if bytes.Equal(payload, doneData) {
			rec.Total = time.Since(intended)
			return
		}
		if bytes.HasPrefix(payload, []byte(`{"error"`)) {
			rec.ErrCode = errorCode(payload)
			rec.fail(ErrStreamError, stage(), time.Since(intended))
			return
		}
		if hasToken(payload) {
			now := time.Now()
			if rec.Chunks == 0 {
				rec.TTFT = now.Sub(intended)
			} else {
				rec.Gaps = append(rec.Gaps, now.Sub(last))
			}
			last = now
			rec.LastToken = now.Sub(intended)
			rec.Chunks++
		}
		if bytes.Contains(payload, usageKey) {
			var u struct {
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if json.Unmarshal(payload, &u) == nil {
				rec.Completion = u.Usage.CompletionTokens
			}
		}
	}
}

// hasToken reports whether an SSE chunk carries generated text.
func hasToken(payload []byte) bool {
	for _, k := range [][]byte{contentKey, textKey} {
		if i := bytes.Index(payload, k); i >= 0 && i+len(k) < len(payload) && payload[i+len(k)] != '"' {
			return true
		}
	}
	return false
}

func (r *Record) fail(class, stage string, at time.Duration) {
	r.ErrClass, r.ErrStage, r.Total = class, stage, at
}

func (r *Record) stage(name string, d time.Duration) {
	if r.StageMS == nil {
		r.StageMS = make(map[string]float64, len(Stages)+1)
	}
	r.StageMS[name] = ms(d)
}

// classify names a transport error.
func classify(ctx context.Context, err error) string {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return ErrTimeout
	case errors.Is(ctx.Err(), context.Canceled):
		return ErrAborted
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return ErrConnect
	}
	return ErrTransport
}

// errorCode returns error.code (or error.type) of an OpenAI error body.
func errorCode(body []byte) string {
	var e struct {
		Error struct {
			Code any    `json:"code"`
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return ""
	}
	if e.Error.Code != nil {
		return fmt.Sprint(e.Error.Code)
	}
	return e.Error.Type
}

// parseServerTiming reads "gateway;dur=0.28, connect;dur=0.06, …" into the
// record's stages.
func parseServerTiming(rec *Record, h string) {
	if h == "" {
		return
	}
	for _, m := range strings.Split(h, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(m), ";")
		for _, p := range strings.Split(params, ";") {
			k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
			if k != "dur" {
				continue
			}
			if f, err := strconv.ParseFloat(strings.Trim(v, `"`), 64); err == nil && f >= 0 {
				if rec.StageMS == nil {
					rec.StageMS = make(map[string]float64, len(Stages)+1)
				}
				rec.StageMS[name] = f
			}
		}
	}
}
