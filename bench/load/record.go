package load

import (
	"encoding/json"
	"maps"
	"math"
	"time"
)

// Stage names, as the gateway writes them in Server-Timing and the admin API,
// in path order. ClientConnect is measured by the bench client itself.
var Stages = []string{"gateway", "connect", "upstream_ttft", "engine_queue", "engine_ttft", "network", "ttft", "total"}

// ClientConnect is the bench client's own TCP connect time (0 when a kept-alive
// connection was reused).
const ClientConnect = "client_connect"

// Error stages: whether the client had a token when the request failed.
const (
	BeforeFirstToken = "before_first_token"
	Midstream        = "midstream"
)

// Record is what the client saw of one request. Times are offsets from the
// start of the run; latencies count from the intended send time, so a request
// the client could not send on time (or that queued for a connection) shows
// that wait in its latency.
type Record struct {
	Index    int
	Span     int
	Intended time.Duration
	Sent     time.Duration // when the client handed it to the transport

	Stream       bool
	Source       string `json:",omitempty"` // the source label sent (x-tailgate-source)
	PromptTokens int    // intended
	MaxTokens    int    // intended
	Completion   int    // completion tokens the answer reported (usage), 0 if unknown

	Status   int    // HTTP status, 0 when none arrived
	ErrClass string // "" when the request succeeded
	ErrCode  string // OpenAI error code from the body, when there was one
	ErrStage string // BeforeFirstToken or Midstream, for errors

	TTFT  time.Duration // to the first token (non-streams: to the response); <0 unknown
	Total time.Duration // to the end of the answer or the error; <0 unknown
	Gaps  []time.Duration
	// LastToken is when the last content chunk of a stream arrived, from
	// the intended send time; <0 unknown (a non-streaming answer arrives
	// whole, so it has no decode time of its own).
	LastToken time.Duration
	// Chunks is the number of content chunks received.
	Chunks int

	RequestID string
	Replica   string
	Attempts  int
	// StageMS holds the gateway's stage durations (milliseconds) and the
	// client's connect time; a stage that is missing is unknown.
	StageMS map[string]float64
}

// OK reports whether the request succeeded.
func (r *Record) OK() bool { return r.ErrClass == "" }

// End is when the request finished (success or error), from the run start.
func (r *Record) End() time.Duration {
	if r.Total < 0 {
		return r.Sent
	}
	return r.Intended + r.Total
}

// FirstToken is when the first token arrived; ok is false if none did.
func (r *Record) FirstToken() (time.Duration, bool) {
	if r.TTFT < 0 {
		return 0, false
	}
	return r.Intended + r.TTFT, true
}

// TPOT is the request's time per output token after the first: the
// decode time (first to last content chunk) over the completion tokens
// after the first, as vLLM's benchmark counts it; ok is false for a
// non-stream, an answer of one token or an unknown count.
func (r *Record) TPOT() (time.Duration, bool) {
	if !r.Stream || r.Completion < 2 || r.TTFT < 0 || r.LastToken < r.TTFT {
		return 0, false
	}
	return (r.LastToken - r.TTFT) / time.Duration(r.Completion-1), true
}

// MaxGap is the longest gap between content chunks.
func (r *Record) MaxGap() time.Duration {
	var m time.Duration
	for _, g := range r.Gaps {
		m = max(m, g)
	}
	return m
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

func optMS(d time.Duration) *float64 {
	if d < 0 {
		return nil
	}
	v := ms(d)
	return &v
}

type recordJSON struct {
	Index        int                `json:"index"`
	Phase        int                `json:"phase"`
	IntendedMS   float64            `json:"intended_ms"`
	SentMS       float64            `json:"sent_ms"`
	Stream       bool               `json:"stream"`
	PromptTokens int                `json:"prompt_tokens,omitempty"`
	MaxTokens    int                `json:"max_tokens,omitempty"`
	Completion   int                `json:"completion_tokens,omitempty"`
	Status       int                `json:"status"`
	Error        string             `json:"error,omitempty"`
	ErrorCode    string             `json:"error_code,omitempty"`
	ErrorStage   string             `json:"error_stage,omitempty"`
	TTFTMS       *float64           `json:"ttft_ms"`
	TotalMS      *float64           `json:"total_ms"`
	LastTokenMS  *float64           `json:"last_token_ms,omitempty"`
	Chunks       int                `json:"chunks,omitempty"`
	MaxGapMS     float64            `json:"max_gap_ms,omitempty"`
	RequestID    string             `json:"request_id,omitempty"`
	Replica      string             `json:"replica,omitempty"`
	Attempts     int                `json:"attempts,omitempty"`
	StagesMS     map[string]float64 `json:"stages_ms,omitempty"`
}

// MarshalJSON writes the record with times in milliseconds; phase is 1-based.
func (r Record) MarshalJSON() ([]byte, error) {
	return json.Marshal(recordJSON{
		Index: r.Index, Phase: r.Span + 1, IntendedMS: ms(r.Intended), SentMS: ms(r.Sent), Stream: r.Stream,
		PromptTokens: r.PromptTokens, MaxTokens: r.MaxTokens, Completion: r.Completion, Status: r.Status,
		Error: r.ErrClass, ErrorCode: r.ErrCode, ErrorStage: r.ErrStage, TTFTMS: optMS(r.TTFT), TotalMS: optMS(r.Total), LastTokenMS: optMS(r.LastToken),
		Chunks: r.Chunks, MaxGapMS: ms(r.MaxGap()), RequestID: r.RequestID, Replica: r.Replica, Attempts: r.Attempts,
		StagesMS: r.StageMS,
	})
}

// UnmarshalJSON reads what MarshalJSON wrote (gaps are not kept, only the
// longest).
func (r *Record) UnmarshalJSON(b []byte) error {
	var j recordJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	d := func(v float64) time.Duration { return time.Duration(v * 1e6) }
	opt := func(p *float64) time.Duration {
		if p == nil {
			return -1
		}
		return d(*p)
	}
	*r = Record{Index: j.Index, Span: j.Phase - 1, Intended: d(j.IntendedMS), Sent: d(j.SentMS), Stream: j.Stream,
		PromptTokens: j.PromptTokens, MaxTokens: j.MaxTokens, Completion: j.Completion, Status: j.Status,
		ErrClass: j.Error, ErrCode: j.ErrorCode, ErrStage: j.ErrorStage, TTFT: opt(j.TTFTMS), Total: opt(j.TotalMS), LastToken: opt(j.LastTokenMS),
		Chunks: j.Chunks, RequestID: j.RequestID, Replica: j.Replica, Attempts: j.Attempts, StageMS: maps.Clone(j.StagesMS)}
	if j.MaxGapMS > 0 {
		r.Gaps = []time.Duration{d(j.MaxGapMS)}
	}
	return nil
}
