package server

import (
	"bytes"
	"context"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/serving/sse"
	"github.com/tailgate-dev/tailgate/serving/tracing"
)

// Traces: one span per request of the public API, named and attributed
// after OpenTelemetry's GenAI conventions ("chat MODEL", gen_ai.*), with a
// child span for admission, one for each upstream attempt (first, hedge,
// retry) and one for the ledger commit; the attempt's span is the parent the
// sidecar (and through it vLLM) continues, through traceparent. No prompt,
// key or secret goes into any attribute: what is recorded is what the
// ledger row and the metrics already say.
//
// Nothing a client sends decides what is recorded. Attribute values are
// the gateway's own or known to it: a model name is one the gateway serves,
// else "unknown" (a 4 MiB name would otherwise sit in every span the
// exporter queues, and break its batches for everyone). A client's
// traceparent is continued only from the networks the operator named
// (Config.TraceFrom); from anywhere else the request starts its own trace
// and the operator's sampling decides. Its tracestate and baggage are
// never taken: they would ride on to the engine.
//
// With tracing off (no Deps.Tracer) a call's trace is nil and every hook
// below returns at its first line: no span, no context, no allocation.

// instrumentation is the tracer's scope name.
const instrumentation = "github.com/tailgate-dev/tailgate/server"

// genAIProvider is gen_ai.provider.name: the engines tailgate fronts speak
// vLLM's API (the simulated one too).
const genAIProvider = "vllm"

// callTrace is one request's spans. Attempts start on the router's
// goroutines, so tries is locked.
type callTrace struct {
	tr   trace.Tracer
	ctx  context.Context // holds the request's span
	span trace.Span

	known func(model string) bool // the models a span may name

	mu    sync.Mutex
	tries []trace.Span // by the call's attempt index (tryLog's)
}

// traceCall starts the span of a public request whose call is cl, as a child
// of the client's traceparent when it sent one; nil when tracing is off.
func (s *Server) traceCall(r *http.Request, cl *call) *callTrace {
	if s.tracer == nil {
		return nil
	}
	op := operationName(cl.ep.path)
	parent := context.Background()
	if s.trustsTrace(r) {
		parent = tracing.ExtractParent(parent, r.Header)
	}
	ctx, span := s.tracer.Start(parent, op,
		trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(cl.start),
		trace.WithAttributes(
			attribute.String("gen_ai.operation.name", op),
			attribute.String("gen_ai.provider.name", genAIProvider),
			attribute.String("http.request.method", r.Method),
			attribute.String("url.path", cl.ep.path),
			attribute.String("tailgate.request_id", cl.id),
			attribute.Int64("tailgate.tenant_id", cl.principal.TenantID),
		))
	return &callTrace{tr: s.tracer, ctx: ctx, span: span, known: s.knownModel}
}

// knownModel reports whether the gateway serves model: a replica of it is
// registered, or the fleet controller can start one.
func (s *Server) knownModel(model string) bool { return s.reg.Known(model) || s.reg.Startable(model) }

// spanModel is a model name as a span may carry it: one the gateway
// serves, else "unknown".
func (t *callTrace) spanModel(model string) string {
	if t.known != nil && t.known(model) {
		return model
	}
	return "unknown"
}

// operationName is gen_ai.operation.name for an endpoint: the conventions'
// chat, text_completion and embeddings, else the endpoint's own word.
func operationName(path string) string {
	switch path {
	case "/v1/chat/completions", "/v1/responses", "/v1/messages":
		return "chat"
	case "/v1/completions":
		return "text_completion"
	case "/v1/embeddings":
		return "embeddings"
	}
	return strings.TrimPrefix(path[strings.LastIndexByte(path, '/'):], "/")
}

// stageSpan is a child span that ends when its step does; the zero value
// (tracing off) does nothing.
type stageSpan struct{ span trace.Span }

// admission starts the admission span, once the request's model is known
// (and names the request's span after it).
func (t *callTrace) admission(cl *call, pr *parsedRequest) stageSpan {
	if t == nil {
		return stageSpan{}
	}
	op, model := operationName(cl.ep.path), t.spanModel(pr.model)
	t.span.SetName(op + " " + model)
	t.span.SetAttributes(requestAttributes(model, pr)...)
	_, span := t.tr.Start(t.ctx, "admission")
	return stageSpan{span}
}

// samplingFields are the request's sampling parameters a span records,
// under the conventions' names (samplingNames).
var (
	samplingFields = []string{"temperature", "top_p"}
	samplingNames  = []string{"gen_ai.request.temperature", "gen_ai.request.top_p"}
)

// requestAttributes are the request span's attributes known once the
// request is read: its model, whether it streams, and the GenAI
// conventions' request parameters (OpenTelemetry semantic conventions
// v1.37.0, docs/gen-ai/gen-ai-spans.md, inference span): max_tokens is
// the completion cap in force (the client's or the gateway's default);
// temperature and top_p only when the body sent upstream has them as
// numbers in the range vLLM accepts (vllm/sampling_params.py,
// _verify_args: temperature ≥ 0, top_p in (0, 1]) — a number, so bounded,
// and nothing else a client writes there is recorded.
func requestAttributes(model string, pr *parsedRequest) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 5)
	attrs = append(attrs, attribute.String("gen_ai.request.model", model), attribute.Bool("tailgate.stream", pr.stream))
	if pr.maxTokens > 0 {
		attrs = append(attrs, attribute.Int64("gen_ai.request.max_tokens", pr.maxTokens))
	}
	if len(pr.body) == 0 || (pr.ctype != "" && !strings.HasPrefix(pr.ctype, "application/json")) {
		return attrs
	}
	var f [2]gjson.Result
	members(gjson.Parse(stringOf(pr.body)), samplingFields, f[:])
	for i, v := range f {
		if v.Type != gjson.Number {
			continue
		}
		x := v.Float()
		if i == 0 && x >= 0 && !math.IsInf(x, 1) || i == 1 && x > 0 && x <= 1 {
			attrs = append(attrs, attribute.Float64(samplingNames[i], x))
		}
	}
	return attrs
}

// admitted ends the admission span: admitted, or refused with the status
// the client got.
func (a stageSpan) admitted(cl *call, ok bool) {
	if a.span == nil {
		return
	}
	result := "admitted"
	if !ok {
		result = "refused"
		a.span.SetStatus(codes.Error, boundString(string(cl.class)))
	}
	a.span.SetAttributes(attribute.String("tailgate.admission", result), attribute.String("tailgate.priority", cl.priority.String()))
	if cl.queueWait >= 0 {
		a.span.SetAttributes(attribute.Float64("tailgate.queue_wait_ms", millis(cl.queueWait)))
	}
	a.span.End()
}

// commit starts the ledger commit's span.
func (t *callTrace) commit() stageSpan {
	if t == nil {
		return stageSpan{}
	}
	_, span := t.tr.Start(t.ctx, "ledger commit")
	return stageSpan{span}
}

// committed ends the ledger commit's span.
func (a stageSpan) committed(err error) {
	if a.span == nil {
		return
	}
	if err != nil {
		a.span.SetStatus(codes.Error, "ledger row not committed")
	}
	a.span.End()
}

// attempt starts the span of the call's attempt i on rep and returns ctx
// carrying it, for the traceparent the replica gets. It ends with the
// request, when its outcome is known.
func (t *callTrace) attempt(ctx context.Context, i int, rep *router.Replica, reason router.AttemptReason) context.Context {
	if t == nil {
		return ctx
	}
	_, span := t.tr.Start(t.ctx, "attempt "+reason.String(), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("tailgate.attempt.role", reason.String()),
			attribute.Int("tailgate.attempt.n", i+1),
			attribute.String("tailgate.replica", rep.ID),
		))
	t.mu.Lock()
	for len(t.tries) <= i {
		t.tries = append(t.tries, nil)
	}
	t.tries[i] = span
	t.mu.Unlock()
	return trace.ContextWithSpan(ctx, span)
}

// inject sets an upstream request's traceparent to its attempt's span.
func (t *callTrace) inject(ctx context.Context, h http.Header) {
	if t == nil {
		return
	}
	tracing.Inject(ctx, h)
}

// end ends the request's span and its attempts', with what the ledger row
// says of them: stages, usage, outcome.
func (t *callTrace) end(cl *call) {
	if t == nil {
		return
	}
	t.mu.Lock()
	tries := t.tries
	t.tries = nil
	t.mu.Unlock()
	if len(tries) > 0 {
		log := cl.attemptLog()
		won := slices.ContainsFunc(log, func(a data.Attempt) bool { return a.Outcome == data.AttemptWon })
		for i, a := range log {
			if i < len(tries) && tries[i] != nil {
				endAttempt(tries[i], cl.start, a, won)
			}
		}
	}

	sp := t.span
	attrs := make([]attribute.KeyValue, 0, 24)
	attrs = append(attrs,
		attribute.Int("http.response.status_code", cl.status),
		attribute.String("tailgate.outcome", string(cl.outcome)),
		attribute.Int("tailgate.attempts", cl.attempts),
		attribute.Bool("tailgate.hedged", cl.hedged),
		attribute.Int64("gen_ai.usage.input_tokens", cl.usage.PromptTokens),
		attribute.Int64("gen_ai.usage.output_tokens", cl.usage.CompletionTokens),
	)
	if cl.overhead > 0 {
		attrs = append(attrs, attribute.Int64("tailgate.hedge_overhead_tokens", cl.overhead))
	}
	if cl.replica != "" {
		attrs = append(attrs, attribute.String("tailgate.replica", cl.replica))
	}
	if cl.winner != "" {
		attrs = append(attrs, attribute.String("tailgate.winner", cl.winner))
	}
	if cl.req != nil && cl.outcome == data.OutcomeOK {
		// The replica answered for the model it was routed by.
		attrs = append(attrs, attribute.String("gen_ai.response.model", t.spanModel(cl.req.model)))
	}
	if u := cl.tries.winnerUpstream(); u != nil {
		if u.respID != "" {
			attrs = append(attrs, attribute.String("gen_ai.response.id", u.respID))
		}
		if len(u.finishes) > 0 {
			attrs = append(attrs, attribute.StringSlice("gen_ai.response.finish_reasons", u.finishes))
		}
	}
	cl.stages.Each(func(_ int, name string, d time.Duration) {
		if d >= 0 {
			attrs = append(attrs, attribute.Float64("tailgate.stage."+name+"_ms", millis(d)))
		}
	})
	sp.SetAttributes(attrs...)
	// A class may be an engine's own error code (relayed): bounded.
	if cl.class != "" {
		sp.SetAttributes(attribute.String("error.type", boundString(string(cl.class))))
	}
	if cl.status >= 500 || cl.outcome == data.OutcomeMidstream {
		sp.SetStatus(codes.Error, boundString(string(cl.class)))
	}
	sp.End()
}

// endAttempt ends an attempt's span at the time it ended, with its outcome:
// won, lost (cancelled: another attempt won), cancelled (the request ended first) or
// failed. Its reason is not recorded: an engine's error text may quote the
// prompt.
func endAttempt(span trace.Span, start time.Time, a data.Attempt, won bool) {
	outcome := a.Outcome
	if outcome == data.AttemptCancelled && won {
		outcome = "lost"
	}
	span.SetAttributes(attribute.String("tailgate.attempt.outcome", outcome),
		attribute.Int64("tailgate.attempt.prompt_tokens", a.PromptTokens),
		attribute.Int64("tailgate.attempt.completion_tokens", a.CompletionTokens))
	if a.TTFT >= 0 {
		span.SetAttributes(attribute.Float64("tailgate.attempt.ttft_ms", millis(a.TTFT)))
	}
	if outcome == data.AttemptFailed {
		span.SetStatus(codes.Error, "attempt failed")
	}
	end := time.Now()
	if a.End >= 0 {
		end = start.Add(a.End)
	}
	span.End(trace.WithTimestamp(end))
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// How an answer ended, for the request span (gen_ai.response.id and
// gen_ai.response.finish_reasons): learnt from what the winning attempt's
// reader already holds — the events it inspects as they pass, the
// assembler's parse of an answer assembled into JSON — and only for a
// traced call. The values are the engine's (an id the gateway's request id
// seeds, finish reasons from a small set), each bounded all the same.

// maxFinishReasons bounds the finish reasons a span records: one per
// choice, and a request has at most maxN.
const maxFinishReasons = maxN

var (
	finishMarker  = []byte(`"finish_reason":"`) // a non-null finish reason, as vLLM and OpenAI write it
	messageStart  = []byte(`"message_start"`)
	messageDelta  = []byte(`"message_delta"`)
	responseEvent = []byte(`"response":{`)
)

func (u *upstream) addFinish(reason string) {
	if reason != "" && len(u.finishes) < maxFinishReasons {
		u.finishes = append(u.finishes, boundString(reason))
	}
}

func (u *upstream) setID(id gjson.Result) {
	if u.respID == "" && id.Type == gjson.String {
		u.respID = boundString(id.Str)
	}
}

// traceEvent learns the response id and finish reasons an event of a
// streamed answer carries: a chunk's id and its choices' non-null
// finish_reason; Messages' message_start (message.id) and message_delta
// (delta.stop_reason); a Responses final event's response (its id, and
// its status or why it is incomplete). Only events that can hold them are
// parsed: the first chunk, a token chunk with a finish reason, and the
// typed events by name.
func (u *upstream) traceEvent(d sse.Dialect, kind sse.Kind, payload []byte) {
	switch d {
	case sse.Chunks:
		if u.respID == "" {
			u.setID(gjson.GetBytes(payload, "id"))
		}
		if kind == sse.Token && bytes.Contains(payload, finishMarker) {
			gjson.GetBytes(payload, "choices.#.finish_reason").ForEach(func(_, r gjson.Result) bool {
				u.addFinish(r.Str)
				return true
			})
		}
	case sse.MessageEvents:
		switch {
		case u.respID == "" && bytes.Contains(payload, messageStart):
			u.setID(gjson.GetBytes(payload, "message.id"))
		case bytes.Contains(payload, messageDelta):
			u.addFinish(gjson.GetBytes(payload, "delta.stop_reason").Str)
		}
	case sse.ResponseEvents:
		if bytes.Contains(payload, responseEvent) {
			r := gjson.GetManyBytes(payload, "response.id", "response.status", "response.incomplete_details.reason")
			u.setID(r[0])
			if kind == sse.Final {
				u.addFinish(responseFinish(r[1], r[2]))
			}
		}
	}
}

// traceAnswer learns the response id and finish reasons of a JSON answer
// the engine sent whole: chat and completions' choices, Messages'
// stop_reason, a Responses answer's status.
func (u *upstream) traceAnswer(body []byte) {
	r := gjson.GetManyBytes(body, "id", "choices.#.finish_reason", "stop_reason", "status", "incomplete_details.reason")
	u.setID(r[0])
	r[1].ForEach(func(_, f gjson.Result) bool {
		u.addFinish(f.Str)
		return true
	})
	u.addFinish(r[2].Str)
	u.addFinish(responseFinish(r[3], r[4]))
}

// responseFinish is a Responses answer's finish reason: why it is
// incomplete (max_output_tokens, content_filter), else its status.
func responseFinish(status, reason gjson.Result) string {
	if reason.Str != "" {
		return reason.Str
	}
	return status.Str
}

// traced hands a traced call's assembled answer's id and finish reasons
// to its attempt: the assembler parsed every chunk once already.
func (a *assembler) traced(cl *call, u *upstream) {
	if cl.trace == nil {
		return
	}
	u.setID(gjson.Parse(a.id))
	for _, c := range a.choices {
		if c.seen && c.finish != "" {
			u.addFinish(gjson.Parse(c.finish).Str)
		}
	}
}

// winnerUpstream is the attempt whose answer the client got, nil if none.
func (t *tryLog) winnerUpstream() *upstream {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.winner < 0 || t.winner >= len(t.recs) {
		return nil
	}
	u, _ := t.recs[t.winner].att.(*upstream)
	return u
}
