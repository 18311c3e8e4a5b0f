package sim

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/tailgate-dev/tailgate/serving"
)

// Pooling endpoints (embeddings, rerank, score) run through the engine as a
// prefill only: they queue for a slot like generation requests, take one
// TTFT draw, and answer in one JSON body with prompt-token usage.

// servePooled answers a validated pooling request of promptTokens: a fault,
// or render's body once the prefill is done.
func (e *Engine) servePooled(w http.ResponseWriter, r *http.Request, promptTokens int, arrived time.Time, render func([]byte) []byte) {
	if e.inject(w, r, false, nil) {
		return
	}
	ctx := r.Context()
	lat := e.lat.draw()
	if err := e.sched.acquire(ctx, promptTokens, 0); err != nil {
		e.abort(0)
		return
	}
	queued := time.Since(arrived)
	e.metrics.queue.Observe(queued.Seconds())
	var p pacer
	defer p.stop()
	if p.sleep(ctx, lat.ttft) != nil {
		e.sched.release(promptTokens)
		e.abort(0)
		return
	}
	end := time.Now()
	e.sched.release(promptTokens)
	e.metrics.prefilled(promptTokens, arrived, end)
	e.finish(0, 0, false, arrived, end, end)
	buf := e.getBuf()
	w.Header()[serving.HeaderSimQueue] = []string{string(appendMillis(nil, queued))}
	*buf = render((*buf)[:0])
	writeJSON(w, http.StatusOK, *buf)
	e.putBuf(buf)
}

// poolInput is one input of a pooling request: its text (or token ids) as
// the simulator counts and hashes it.
type poolInput struct {
	text   string
	tokens int
	hash   uint32
}

func textInput(s string) poolInput {
	return poolInput{text: s, tokens: TextPromptTokens(s), hash: fnvString(fnvOffset, s)}
}

// readInputs reads a pooling input field: a string, a list of strings, a
// list of token ids or a list of lists of token ids (CompletionRequestMixin,
// vllm/entrypoints/pooling/base/protocol.py@65772ef1). It returns nil and
// records a pydantic error when the value is none of them.
func (r *reader) readInputs(name string) []poolInput {
	v, ok := r.raw[name]
	if !ok {
		return nil
	}
	if s, ok := asString(v); ok {
		return []poolInput{textInput(s)}
	}
	var strs []string
	if json.Unmarshal(v, &strs) == nil && len(v) > 0 && v[0] == '[' {
		if len(strs) == 0 {
			return []poolInput{}
		}
		out := make([]poolInput, len(strs))
		for i, s := range strs {
			out[i] = textInput(s)
		}
		return out
	}
	var ids []int64
	if json.Unmarshal(v, &ids) == nil {
		return []poolInput{idsInput(ids)}
	}
	var batches [][]int64
	if json.Unmarshal(v, &batches) == nil {
		out := make([]poolInput, len(batches))
		for i, b := range batches {
			out[i] = idsInput(b)
		}
		return out
	}
	loc := r.loc + "." + name
	r.errs = append(r.errs,
		pyErr{typ: "list_type", loc: loc, msg: "Input should be a valid list", input: summarize(v)},
		pyErr{typ: "string_type", loc: loc, msg: "Input should be a valid string", input: summarize(v)})
	return nil
}

func idsInput(ids []int64) poolInput {
	h := uint32(fnvOffset)
	for _, id := range ids {
		h = fnvString(h, strconv.FormatInt(id, 10)+",")
	}
	return poolInput{tokens: len(ids), hash: h}
}

// checkLength refuses an input longer than the context, as the renderer
// does for pooling requests (no output tokens).
func (e *Engine) checkLength(in []poolInput) *apiError {
	for _, x := range in {
		if x.tokens > e.cfg.MaxModelLen {
			return badRequest("input_tokens", fmt.Sprintf(
				"You passed %d input tokens and requested 0 output tokens. However, the model's context length is only %d tokens, resulting in a maximum input length of %d tokens. Please reduce the length of the input prompt.",
				x.tokens, e.cfg.MaxModelLen, e.cfg.MaxModelLen))
		}
	}
	return nil
}

// embeddingChatSpecs: EmbeddingChatRequest, the union's second member
// (vllm/entrypoints/pooling/embed/protocol.py@ff8d577a): one input, the
// conversation as its chat template renders it.
var embeddingChatSpecs = []fspec{
	{name: "model", typ: tStr, nullable: true},
	{name: "messages", typ: tList, required: true},
	{name: "encoding_format", typ: tStr},
	{name: "dimensions", typ: tInt, nullable: true},
	{name: "user", typ: tStr, nullable: true},
	{name: "truncate_prompt_tokens", typ: tInt, nullable: true},
	{name: "add_generation_prompt", typ: tBool},
	{name: "continue_final_message", typ: tBool},
	{name: "add_special_tokens", typ: tBool},
	{name: "normalize", typ: tBool, nullable: true},
	{name: "embed_dtype", typ: tStr},
	{name: "endianness", typ: tStr},
}

// readChatInput reads an EmbeddingChatRequest's messages as one input: the
// role markers and text of each message, as /tokenize counts them.
func (r *reader) readChatInput() []poolInput {
	r.check(embeddingChatSpecs)
	msgs := r.checkMessages()
	if len(r.errs) > 0 {
		return nil
	}
	var text []byte
	tokens := 0
	for i, m := range msgs {
		var h uint32
		if _, aerr := messageContent(m.content, i, &h, nil); aerr != nil {
			r.errs = append(r.errs, pyErr{typ: "value_error", loc: r.loc + ".messages", msg: aerr.msg, input: "list"})
			return nil
		}
		t := contentText(m.content)
		text = append(text, t...)
		tokens += 4 + TextPromptTokens(t)
	}
	return []poolInput{{text: string(text), tokens: tokens, hash: fnvString(fnvOffset, string(text))}}
}

// embeddingSpecs: EmbeddingCompletionRequest
// (vllm/entrypoints/pooling/embed/protocol.py@ff8d577a).
var embeddingSpecs = []fspec{
	{name: "model", typ: tStr, nullable: true},
	{name: "input", typ: tAny, required: true},
	{name: "encoding_format", typ: tStr},
	{name: "dimensions", typ: tInt, nullable: true},
	{name: "user", typ: tStr, nullable: true},
	{name: "truncate_prompt_tokens", typ: tInt, nullable: true},
	{name: "normalize", typ: tBool, nullable: true},
	{name: "embed_dtype", typ: tStr},
	{name: "endianness", typ: tStr},
}

// handlePostEmbeddings answers /v1/embeddings: one unit vector per input,
// drawn from the input's hash, in vLLM's EmbeddingResponse
// (vllm/entrypoints/pooling/embed/protocol.py@ff8d577a, serialized with
// model_dump() by embed/api_router.py@0193ccc0): float lists, or base64 of
// little-endian float32 with "encoding_format":"base64".
func (e *Engine) handlePostEmbeddings(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	body, aerr := readJSONRequest(w, r)
	if aerr == nil {
		var rd *reader
		if rd, aerr = readJSONBody(body); aerr == nil {
			var inputs []poolInput
			if _, hasInput := rd.raw["input"]; !hasInput && rd.raw["messages"] != nil {
				inputs = rd.readChatInput()
			} else {
				rd.check(embeddingSpecs)
				inputs = rd.readInputs("input")
			}
			format, _ := rd.str("encoding_format")
			switch {
			case len(rd.errs) > 0:
				aerr = validationError(rd.errs)
			case format != "" && format != "float" && format != "base64":
				aerr = validationError([]pyErr{{typ: "literal_error", loc: "body.encoding_format",
					msg: "Input should be 'float', 'base64' or 'bytes'", input: format}})
			}
			if aerr == nil {
				model, _ := rd.str("model")
				aerr = e.checkModel(model)
			}
			if aerr == nil {
				aerr = e.serveEmbeddings(w, r, rd, inputs, format == "base64", arrived)
			}
		}
	}
	if aerr != nil {
		writeError(w, aerr)
	}
}

func (e *Engine) serveEmbeddings(w http.ResponseWriter, r *http.Request, rd *reader, inputs []poolInput, b64 bool, arrived time.Time) *apiError {
	if len(inputs) == 0 {
		return badRequest("input", "Input cannot be empty")
	}
	if aerr := e.checkLength(inputs); aerr != nil {
		return aerr
	}
	dim := e.cfg.EmbeddingDim
	if v, ok := rd.int("dimensions"); ok {
		if v < 1 || int(v) > dim {
			return badRequest("dimensions", fmt.Sprintf("dimensions must be between 1 and %d (the simulated model's size), got %d", dim, v))
		}
		dim = int(v)
	}
	prompt := 0
	for _, in := range inputs {
		prompt += in.tokens
	}
	id := requestID(r)
	e.servePooled(w, r, prompt, arrived, func(b []byte) []byte {
		b = append(b, `{"id":`...)
		b = appendJSONString(b, "embd-"+id)
		b = append(b, `,"object":"list","created":`...)
		b = strconv.AppendInt(b, time.Now().Unix(), 10)
		b = append(b, `,"model":`...)
		b = append(b, e.modelJSON...)
		b = append(b, `,"data":[`...)
		for i, in := range inputs {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"index":`...)
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, `,"object":"embedding","embedding":`...)
			v := embedding(in.hash, dim)
			if b64 {
				raw := make([]byte, 4*len(v))
				for k, x := range v {
					binary.LittleEndian.PutUint32(raw[4*k:], math.Float32bits(x))
				}
				b = append(b, '"')
				b = base64.StdEncoding.AppendEncode(b, raw)
				b = append(b, '"')
			} else {
				b = append(b, '[')
				for k, x := range v {
					if k > 0 {
						b = append(b, ',')
					}
					b = appendPyFloat(b, float64(x))
				}
				b = append(b, ']')
			}
			b = append(b, '}')
		}
		b = append(b, `],"usage":`...)
		b = appendUsageCounts(b, prompt, 0)
		return append(b, `,"prompt_tokens_details":null,"completion_tokens_details":null}}`...)
	})
	return nil
}

// embedding returns the unit vector of an input with hash h: dim seeded
// normal draws, normalized. A shorter dim is a prefix of the same draws,
// like a matryoshka model's.
func embedding(h uint32, dim int) []float32 {
	rng := rand.New(rand.NewPCG(uint64(h), 0x3c6ef372fe94f82b))
	v := make([]float64, dim)
	norm := 0.0
	for k := range v {
		v[k] = rng.NormFloat64()
		norm += v[k] * v[k]
	}
	norm = math.Sqrt(norm)
	out := make([]float32, dim)
	for k, x := range v {
		out[k] = float32(x / norm)
	}
	return out
}
