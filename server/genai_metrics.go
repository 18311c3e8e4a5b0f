package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tailgate-dev/tailgate/data"
)

// The OpenTelemetry GenAI conventions' metrics (semantic conventions
// v1.37.0 and later, docs/gen-ai/gen-ai-metrics.md; read at v1.41.0), under
// the names their Prometheus export gives them (dots to underscores, the
// unit's suffix: gen_ai.server.request.duration in s is
// gen_ai_server_request_duration_seconds; gen_ai.client.token.usage in
// {token} keeps its name), with the buckets the conventions recommend. The
// gateway is the GenAI server its clients talk to: request duration, time
// to first token and time per output token are measured where they see
// them. Token usage is what each request was billed (the conventions: a
// system that reports both used and billable tokens reports billable).
//
// Labels are the conventions' attributes that stay bounded: the operation
// (one per endpoint), the model — a model the gateway serves, the label
// the tailgate_* metrics use — never a tenant or key, and error_type, the
// ledger's outcome of a request that did not end ok. gen_ai_provider_name
// is "vllm" on every series (genAIProvider).
type genAIMetrics struct {
	duration *prometheus.HistogramVec // operation, request model, response model, error_type
	ttft     *prometheus.HistogramVec // operation, request model, response model
	tpot     *prometheus.HistogramVec // operation, request model, response model
	tokens   *prometheus.HistogramVec // operation, token type, request model, response model
}

// The conventions' ExplicitBucketBoundaries for each metric.
var (
	genAIDurationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	genAITTFTBuckets     = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0}
	genAITPOTBuckets     = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}
	genAITokenBuckets    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
)

const (
	labelOperation     = "gen_ai_operation_name"
	labelRequestModel  = "gen_ai_request_model"
	labelResponseModel = "gen_ai_response_model"
	labelTokenType     = "gen_ai_token_type"
	labelErrorType     = "error_type"
)

func newGenAIMetrics() genAIMetrics {
	provider := prometheus.Labels{"gen_ai_provider_name": genAIProvider}
	hist := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: provider}, labels)
	}
	return genAIMetrics{
		duration: hist("gen_ai_server_request_duration_seconds",
			"GenAI request duration, received to last byte (OpenTelemetry gen_ai.server.request.duration); error_type is the outcome of a request that did not end ok.",
			genAIDurationBuckets, labelOperation, labelRequestModel, labelResponseModel, labelErrorType),
		ttft: hist("gen_ai_server_time_to_first_token_seconds",
			"Time to first token of successful streamed answers, client-visible (OpenTelemetry gen_ai.server.time_to_first_token).",
			genAITTFTBuckets, labelOperation, labelRequestModel, labelResponseModel),
		tpot: hist("gen_ai_server_time_per_output_token_seconds",
			"Time per output token after the first, of successful streamed answers (OpenTelemetry gen_ai.server.time_per_output_token).",
			genAITPOTBuckets, labelOperation, labelRequestModel, labelResponseModel),
		tokens: hist("gen_ai_client_token_usage",
			"Tokens billed per request, by type: input or output (OpenTelemetry gen_ai.client.token.usage).",
			genAITokenBuckets, labelOperation, labelTokenType, labelRequestModel, labelResponseModel),
	}
}

// genAIObservers are one model's and operation's children for a request
// that ended ok (the response model is the request's), cached so the hot
// path does no label hashing.
type genAIObservers struct {
	op                        string
	duration, ttft, tpot      prometheus.Observer
	inputTokens, outputTokens prometheus.Observer
}

// genAIFor returns the children of ep's operation; an endpoint that
// generates nothing has no output series (ttft, tpot, output tokens nil).
func (mm *modelMetrics) genAIFor(g *genAIMetrics, ep endpoint) *genAIObservers {
	return mm.genAI.loadOrMake(ep.path, func() *genAIObservers {
		op, model := operationName(ep.path), mm.model
		o := &genAIObservers{
			op:          op,
			duration:    g.duration.WithLabelValues(op, model, model, ""),
			inputTokens: g.tokens.WithLabelValues(op, "input", model, model),
		}
		if ep.generates {
			o.ttft = g.ttft.WithLabelValues(op, model, model)
			o.tpot = g.tpot.WithLabelValues(op, model, model)
			o.outputTokens = g.tokens.WithLabelValues(op, "output", model, model)
		}
		return o
	})
}

// observeGenAI counts a finished call in the GenAI metrics: one that named a
// model the gateway serves (cl.mm), as it stands when its ledger row is
// written. Time to first token and per output token are a successful
// stream's (a JSON answer's first token is its last). A call that did not
// end ok is timed under its outcome; the response model is the request's
// once output reached the client, else empty.
func (m *metrics) observeGenAI(cl *call) {
	if cl.mm == nil || cl.req == nil {
		return
	}
	o := cl.mm.genAIFor(&m.genAI, cl.ep)
	model := cl.mm.model
	if cl.outcome == data.OutcomeOK {
		if cl.stages.Total >= 0 {
			o.duration.Observe(cl.stages.Total.Seconds())
		}
		if o.ttft != nil && cl.req.stream && cl.stages.TTFT >= 0 {
			o.ttft.Observe(cl.stages.TTFT.Seconds())
			if n := cl.usage.CompletionTokens; n > 1 && cl.stages.Total > cl.stages.TTFT {
				o.tpot.Observe((cl.stages.Total - cl.stages.TTFT).Seconds() / float64(n-1))
			}
		}
		if cl.usage.PromptTokens > 0 {
			o.inputTokens.Observe(float64(cl.usage.PromptTokens))
		}
		if o.outputTokens != nil && cl.usage.CompletionTokens > 0 {
			o.outputTokens.Observe(float64(cl.usage.CompletionTokens))
		}
		return
	}
	resp := ""
	if cl.firstToken {
		resp = model
	}
	if cl.stages.Total >= 0 {
		m.genAI.duration.WithLabelValues(o.op, model, resp, string(cl.outcome)).Observe(cl.stages.Total.Seconds())
	}
	if cl.usage.PromptTokens > 0 {
		m.genAI.tokens.WithLabelValues(o.op, "input", model, resp).Observe(float64(cl.usage.PromptTokens))
	}
	if cl.usage.CompletionTokens > 0 {
		m.genAI.tokens.WithLabelValues(o.op, "output", model, resp).Observe(float64(cl.usage.CompletionTokens))
	}
}
