package load

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Dist is a distribution of token counts.
type Dist struct {
	Kind   string  // "fixed", "lognormal" or "uniform"
	A, B   float64 // fixed: A; lognormal: median A, sigma B; uniform: A..B inclusive
	source string
}

// ParseDist parses a token-count distribution:
//
//	128                 always 128 (also fixed:128)
//	lognormal:256:0.6   lognormal with median 256 and spread (sigma) 0.6
//	uniform:16:512      uniform between 16 and 512, inclusive
//
// Draws are rounded and never below 1.
func ParseDist(s string) (Dist, error) {
	parts := strings.Split(strings.TrimSpace(s), ":")
	num := func(i int) (float64, error) {
		if i >= len(parts) {
			return 0, fmt.Errorf("%q: missing a number", s)
		}
		v, err := strconv.ParseFloat(parts[i], 64)
		if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return 0, fmt.Errorf("%q: %q is not a non-negative number", s, parts[i])
		}
		return v, nil
	}
	d := Dist{source: s}
	var err error
	switch kind := strings.ToLower(parts[0]); {
	case len(parts) == 1:
		d.Kind = "fixed"
		d.A, err = num(0)
	case kind == "fixed" && len(parts) == 2:
		d.Kind = "fixed"
		d.A, err = num(1)
	case (kind == "lognormal" || kind == "uniform") && len(parts) == 3:
		d.Kind = kind
		if d.A, err = num(1); err == nil {
			d.B, err = num(2)
		}
		if err == nil && kind == "uniform" && d.B < d.A {
			err = fmt.Errorf("%q: uniform needs MIN <= MAX", s)
		}
		if err == nil && kind == "lognormal" && d.B > 5 {
			err = fmt.Errorf("%q: a spread above 5 is not a useful token distribution", s)
		}
	default:
		return Dist{}, fmt.Errorf("%q: want N, fixed:N, lognormal:MEDIAN:SPREAD or uniform:MIN:MAX", s)
	}
	if err != nil {
		return Dist{}, err
	}
	if d.A < 1 && d.Kind != "uniform" {
		return Dist{}, fmt.Errorf("%q: the median or value must be at least 1", s)
	}
	return d, nil
}

// String returns the distribution as it was written.
func (d Dist) String() string {
	if d.source != "" {
		return d.source
	}
	switch d.Kind {
	case "lognormal", "uniform":
		return fmt.Sprintf("%s:%s:%s", d.Kind, trimFloat(d.A), trimFloat(d.B))
	}
	return trimFloat(d.A)
}

// maxTokensDrawn caps a draw, so a wide spread cannot ask for absurd prompts.
const maxTokensDrawn = 1 << 20

// Draw returns one token count.
func (d Dist) Draw(r *rand.Rand) int {
	var v float64
	switch d.Kind {
	case "lognormal":
		v = d.A * math.Exp(d.B*r.NormFloat64())
	case "uniform":
		v = d.A + r.Float64()*(d.B-d.A+1)
		v = math.Floor(v)
	default:
		v = d.A
	}
	return int(min(max(math.Round(v), 1), maxTokensDrawn))
}

// ReplayEntry is one line of a replay file: either a whole request body (it
// has "messages" or "prompt") or the lengths of one.
type ReplayEntry struct {
	Body         json.RawMessage // a request body sent as is (model set when missing or overridden)
	PromptTokens int
	OutputTokens int
	Stream       *bool
}

// ReadReplay reads a JSONL replay file. Each line is a JSON object, either a
// request body for /v1/chat/completions ("messages") or /v1/completions
// ("prompt"), or {"prompt_tokens":N,"output_tokens":M,"stream":true}.
// "stream" may be left out in both; it is then drawn from the stream fraction.
// Blank lines and lines starting with # are skipped.
func ReadReplay(r io.Reader) ([]ReplayEntry, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var out []ReplayEntry
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		var probe struct {
			Messages     json.RawMessage `json:"messages"`
			Prompt       json.RawMessage `json:"prompt"`
			PromptTokens int             `json:"prompt_tokens"`
			OutputTokens int             `json:"output_tokens"`
			Stream       *bool           `json:"stream"`
		}
		if err := json.Unmarshal(line, &probe); err != nil {
			return nil, fmt.Errorf("replay line %d: %w", n, err)
		}
		e := ReplayEntry{Stream: probe.Stream}
		switch {
		case probe.Messages != nil || probe.Prompt != nil:
			e.Body = append(json.RawMessage(nil), line...)
		case probe.PromptTokens > 0 && probe.OutputTokens > 0:
			e.PromptTokens, e.OutputTokens = probe.PromptTokens, probe.OutputTokens
		default:
			return nil, fmt.Errorf("replay line %d: want a request body (messages or prompt) or prompt_tokens and output_tokens above 0", n)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("replay file has no requests")
	}
	return out, nil
}

// WorkloadConfig describes the requests of a run. The same config (seed
// included) yields the same sequence of requests.
type WorkloadConfig struct {
	// Model is the model every request names; required unless every replay
	// body names its own.
	Model string
	// Completions sends /v1/completions with a prompt instead of
	// /v1/chat/completions with one user message.
	Completions bool
	// Prompt and Output are the token-count distributions; the zero Dist
	// means 128 and 64 tokens.
	Prompt, Output Dist
	// StreamFraction is the share of requests that stream, in [0, 1].
	StreamFraction float64
	// IgnoreEOS asks the engine to generate exactly the drawn output length
	// (vLLM's ignore_eos). OpenAI's own API rejects the field.
	IgnoreEOS bool
	// Replay, when set, replaces the drawn lengths: request i is line
	// i mod len(Replay).
	Replay []ReplayEntry
	// Seed seeds every draw.
	Seed int64
	// Sources, when set, label the requests in turn (request i gets
	// Sources[i mod len]), sent as the x-tailgate-source header, so the
	// report shows each source's latencies apart.
	Sources []string
}

// Request is one request of the workload.
type Request struct {
	Index        int
	Path         string // relative to the base URL: /chat/completions or /completions
	Stream       bool
	PromptTokens int // intended prompt length (0 for replayed bodies)
	MaxTokens    int // intended output length (0 for replayed bodies that set none)
	Body         []byte
	Source       string // x-tailgate-source; "" sends none
}

// Workload yields requests by index.
type Workload struct{ cfg WorkloadConfig }

// NewWorkload validates cfg.
func NewWorkload(cfg WorkloadConfig) (*Workload, error) {
	if cfg.Prompt.Kind == "" {
		cfg.Prompt = Dist{Kind: "fixed", A: 128}
	}
	if cfg.Output.Kind == "" {
		cfg.Output = Dist{Kind: "fixed", A: 64}
	}
	if cfg.StreamFraction < 0 || cfg.StreamFraction > 1 || math.IsNaN(cfg.StreamFraction) {
		return nil, fmt.Errorf("stream fraction %v: want a number from 0 to 1", cfg.StreamFraction)
	}
	if cfg.Model == "" {
		for _, e := range cfg.Replay {
			if e.Body == nil || !bytes.Contains(e.Body, []byte(`"model"`)) {
				return nil, errors.New("a model is required")
			}
		}
		if len(cfg.Replay) == 0 {
			return nil, errors.New("a model is required")
		}
	}
	return &Workload{cfg: cfg}, nil
}

// Config returns the workload's configuration.
func (w *Workload) Config() WorkloadConfig { return w.cfg }

// Describe summarizes the workload in one line.
func (w *Workload) Describe() string {
	c := w.cfg
	if len(c.Replay) > 0 {
		return fmt.Sprintf("replay of %d requests, %.0f%% streams where unset", len(c.Replay), 100*c.StreamFraction)
	}
	return fmt.Sprintf("prompt %s, output %s tokens, %.0f%% streams", c.Prompt, c.Output, 100*c.StreamFraction)
}

// Request returns request i. It depends only on the config and i, so runs of
// different lengths agree on the requests they share.
func (w *Workload) Request(i int) Request {
	c := w.cfg
	r := rand.New(rand.NewPCG(uint64(c.Seed), uint64(i)))
	stream := r.Float64() < c.StreamFraction
	req := Request{Index: i, Path: "/chat/completions"}
	if len(c.Sources) > 0 {
		req.Source = c.Sources[i%len(c.Sources)]
	}
	if c.Completions {
		req.Path = "/completions"
	}
	if len(c.Replay) > 0 {
		e := c.Replay[i%len(c.Replay)]
		if e.Stream != nil {
			stream = *e.Stream
		}
		if e.Body != nil {
			req.Stream = stream
			req.Body, req.Path = replayBody(e.Body, c, stream)
			return req
		}
		req.PromptTokens, req.MaxTokens = e.PromptTokens, e.OutputTokens
	} else {
		req.PromptTokens, req.MaxTokens = c.Prompt.Draw(r), c.Output.Draw(r)
	}
	req.Stream = stream
	req.Body = synthBody(c, req, r)
	return req
}

// words are short, common English words: each is about one token in the
// usual BPE vocabularies, and with its space exactly four bytes, which the
// simulated engine counts as one token.
var words = strings.Fields(`the and for are but not you all any can had her was one our out day get has him his how man new now old see two way who boy did its let put say she too use act add age ago air arm art ask bad bag bar bed big bit box bus buy car cat cup cut dog dry ear eat egg end eye far few fit fly fun gas god gun hat hit hot ice job key kid lab law lay leg lie lot low map mix net oil own pay pen per pop pot red row run sea set sit six sky son sun tax tea ten tie top toy try war web win yes yet zoo`)

// synthBody builds a request body of about req.PromptTokens tokens.
func synthBody(c WorkloadConfig, req Request, r *rand.Rand) []byte {
	// Chat templates add a few tokens (the simulated engine counts 7 for one
	// user message); a raw prompt adds none.
	n := req.PromptTokens
	if !c.Completions {
		n -= 7
	}
	n = max(n, 1)
	var text strings.Builder
	text.Grow(4 * n)
	text.WriteString(words[req.Index%len(words)])
	for range n - 1 {
		text.WriteByte(' ')
		text.WriteString(words[r.IntN(len(words))])
	}
	body := map[string]any{"model": c.Model, "max_tokens": req.MaxTokens}
	if c.Completions {
		body["prompt"] = text.String()
	} else {
		body["messages"] = []map[string]string{{"role": "user", "content": text.String()}}
	}
	if c.IgnoreEOS {
		body["ignore_eos"] = true
	}
	if req.Stream {
		body["stream"] = true
		body["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(body) // maps of strings and numbers always marshal
	return b
}

// replayBody prepares a replayed body: the model set when the config names
// one or the body has none, stream set as decided.
func replayBody(raw json.RawMessage, c WorkloadConfig, stream bool) ([]byte, string) {
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		return raw, "/chat/completions" // ReadReplay checked it; not reached
	}
	path := "/chat/completions"
	if _, ok := body["messages"]; !ok {
		path = "/completions"
	}
	if c.Model != "" {
		body["model"] = c.Model
	}
	if stream {
		body["stream"] = true
		if _, ok := body["stream_options"]; !ok {
			body["stream_options"] = map[string]bool{"include_usage": true}
		}
	} else {
		delete(body, "stream")
		delete(body, "stream_options")
	}
	b, err := json.Marshal(body)
	if err != nil {
		return raw, path
	}
	return b, path
}
