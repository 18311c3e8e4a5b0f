package server

import (
	"bytes"
	"errors"
	"hash/fnv"
	"strconv"
	"unsafe"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tailgate-dev/tailgate/server/apierr"
	"github.com/tailgate-dev/tailgate/server/strictjson"
)

// parsedRequest is what the gateway needs to know of a generation request.
// The body is kept as bytes and forwarded with minimal edits, so fields the
// gateway does not know reach the engine untouched; the fields it acts on
// are rewritten to exactly what it decided, so the engine cannot read them
// another way.
type parsedRequest struct {
	body   []byte // as sent upstream
	ctype  string // its content type; "" is application/json
	model  string
	stream bool // the client asked for a stream
	// assemble: the client asked for JSON, the engine is asked for a stream
	// (with usage on every chunk) and the gateway assembles the answer, so
	// the request is hedged on its first token like a stream — where it can
	// be: only when its model has more than one replica ready. With one,
	// no hedge, pace hedge or retry elsewhere can start, and the engine's
	// own JSON is relayed instead (a stream parsed and built again cost a
	// JSON answer about as much gateway CPU as everything else together).
	// Requests an engine would answer differently when streamed (beam
	// search, prompt logprobs, which vLLM refuses with stream: true) go
	// upstream as JSON.
	assemble bool
	// forcedTool: tool_choice is "required" or names a function.
	forcedTool bool
	wantUsage  bool // the client asked for the usage chunk
	// wantContinuous: the client asked for usage on every chunk too
	// (stream_options.continuous_usage_stats, with include_usage).
	wantContinuous bool
	maxTokens      int64 // the completion cap in force for one sequence (client's or the default)
	// sequences is how many completions the engine generates: n, times the
	// number of prompts of a /v1/completions prompt list.
	sequences int64
	// promptBound is a guaranteed upper bound of the prompt's tokens: every
	// token of a byte-level tokenizer covers at least one byte, so the body's
	// length (plus room for template tokens) can never be exceeded — except
	// by media the engine fetches or decodes (images, audio, video), each of
	// which is bounded by the configured media part size.
	promptBound int64
	// promptEstimate is the likely prompt size (about 4 bytes a token), used
	// for token-per-minute limits and reconciled after the answer.
	promptEstimate int64
	// prefix hashes the prompt's leading part (the system prompt, or the
	// first 256 bytes) for prefix-affinity routing; 0 when empty.
	prefix uint64
	// session hashes the session the body names (prompt_cache_key, user,
	// metadata.user_id; see session.go); 0 for none.
	session uint64
}

// Bounds on what one request may ask for.
const (
	// maxN bounds n (completions per prompt).
	maxN = 128
	// maxPrompts bounds the prompts of one /v1/completions prompt list.
	maxPrompts = 1024
	// DefaultMediaPartTokens is the prompt tokens reserved for each image,
	// audio or video part of a chat message when Config.MediaPartTokens is 0.
	DefaultMediaPartTokens = 16384
)

// parseLimits are the request-reading settings parseRequest needs.
type parseLimits struct {
	maxDepth   int
	mediaPart  int64
	defaultMax func(model string) int64
	// contextLen is the model's context length at its replicas (0:
	// unknown); nil means unknown everywhere.
	contextLen func(model string) int64
	// alternatives reports whether the model has more than one replica
	// ready (a JSON answer is assembled from a stream only then); nil
	// means yes.
	alternatives func(model string) bool
}

// requestFields are the top-level members of a request body parseRequest
// reads, in the order readFields returns them.
var requestFields = [...]string{"model", "stream", "max_tokens", "max_completion_tokens", "stream_options", "messages", "prompt", "n", "best_of",
	"use_beam_search", "prompt_logprobs", "tool_choice", "priority", "prompt_cache_key", "user"}

// roleContent are the members of a chat message parseRequest reads.
var roleContent = [...]string{"role", "content"}

// readFields returns the members of the JSON object body named in
// requestFields (a zero Result for one it lacks), in one walk of the
// object. gjson.GetMany walks it once for each name, skipping every other
// member's value each time, the messages array among them: 15 walks, 3 %
// of the gateway's CPU at 1000 small JSON requests a second (pprof), and
// more the longer a conversation (BenchmarkReadFields). The body was
// checked to repeat no key.
func readFields(body string) (f [len(requestFields)]gjson.Result) {
	members(gjson.Parse(body), requestFields[:], f[:])
	return f
}

// members sets out[i] to obj's member names[i] (a zero Result where it has
// none) in one walk of the object, where a Get for each name walks it once
// each; of a repeated key the first counts, as for Get.
func members(obj gjson.Result, names []string, out []gjson.Result) {
	obj.ForEach(func(k, v gjson.Result) bool {
		for i, n := range names {
			if k.Str == n {
				if !out[i].Exists() {
					out[i] = v
				}
				break
			}
		}
		return true
	})
}

// parseRequest validates body for ep and prepares what is sent upstream:
// the body must be JSON that reads one way only (no repeated key, bounded
// nesting); the fields the gateway acts on are checked and rewritten in
// canonical form; the default max_tokens is applied when the client set
// none, and streams always ask upstream for usage (stripped again if the
// client did not ask).
func parseRequest(ep endpoint, body []byte, ctype string, lim parseLimits) (*parsedRequest, error) {
	if ep.read != nil {
		return ep.read(ep, body, ctype, lim)
	}
	if len(body) == 0 {
		return nil, apierr.BadRequest("", "request body is empty; send a JSON object")
	}
	if err := checkJSON(body, lim.maxDepth); err != nil {
		return nil, err
	}
	if body[firstNonSpace(body)] != '{' {
		return nil, apierr.BadRequest("", "request body must be a JSON object")
	}
	// gjson over a string view of the body: results alias it instead of
	// copying (a 4 MiB messages array would otherwise be copied whole).
	fields := readFields(unsafe.String(unsafe.SliceData(body), len(body)))
	model, stream, maxTok, maxCompl, streamOpts, messages, prompt, n, bestOf := fields[0], fields[1], fields[2], fields[3], fields[4], fields[5], fields[6], fields[7], fields[8]
	beam, promptLogprobs, toolChoice, priority := fields[9], fields[10], fields[11], fields[12]

	p := &parsedRequest{body: body, sequences: 1}
	switch {
	case !model.Exists():
		return nil, apierr.BadRequest("model", "you must provide a model parameter")
	case model.Type != gjson.String || model.Str == "":
		return nil, apierr.BadRequest("model", "model must be a non-empty string")
	}
	p.model = model.Str
	if stream.Exists() && !isBool(stream) && stream.Type != gjson.Null {
		return nil, apierr.BadRequest("stream", "stream must be a boolean")
	}
	p.stream = stream.Type == gjson.True
	p.assemble = !p.stream && beam.Type != gjson.True && promptLogprobs.Type == gjson.Null &&
		(lim.alternatives == nil || lim.alternatives(p.model))
	p.forcedTool = toolChoice.IsObject() || toolChoice.Type == gjson.String && toolChoice.Str == "required"
	var media int64
	if ep.chat {
		if !messages.Exists() {
			return nil, apierr.BadRequest("messages", "you must provide a messages parameter")
		}
		if !messages.IsArray() {
			return nil, apierr.BadRequest("messages", "messages must be a non-empty array")
		}
		i := 0
		var bad error
		messages.ForEach(func(_, m gjson.Result) bool {
			var rc [2]gjson.Result // role, content; none for a non-object
			members(m, roleContent[:], rc[:])
			if !m.IsObject() || rc[0].Type != gjson.String {
				bad = apierr.BadRequest("messages", "messages[%d] must be an object with a string role", i)
				return false
			}
			if c := rc[1]; c.IsArray() {
				c.ForEach(func(_, part gjson.Result) bool {
					switch part.Get("type").Str {
					case "text", "refusal", "":
					default: // image_url, input_audio, audio_url, video_url, file, …
						media++
					}
					return true
				})
			}
			i++
			return true
		})
		if bad != nil {
			return nil, bad
		}
		if i == 0 {
			return nil, apierr.BadRequest("messages", "messages must be a non-empty array")
		}
	} else {
		if !prompt.Exists() {
			return nil, apierr.BadRequest("prompt", "you must provide a prompt parameter")
		}
		if prompt.Type != gjson.String && !prompt.IsArray() {
			return nil, apierr.BadRequest("prompt", "prompt must be a string or an array")
		}
		if prompt.IsArray() {
			// A list of strings or of token-id lists is one request per
			// prompt; a flat list of token ids is one prompt.
			if first := prompt.Get("0"); first.Type == gjson.String || first.IsArray() {
				k := int64(len(prompt.Array()))
				if k > maxPrompts {
					return nil, apierr.BadRequest("prompt", "at most %d prompts in one request", maxPrompts)
				}
				p.sequences = max(k, 1)
			}
		}
	}
	if n.Exists() && n.Type != gjson.Null {
		if n.Type != gjson.Number || n.Num != float64(int64(n.Num)) || n.Num < 1 || n.Num > maxN {
			return nil, apierr.BadRequest("n", "n must be an integer from 1 to %d", maxN)
		}
		p.sequences *= int64(n.Num)
	}
	if bestOf.Exists() && bestOf.Type != gjson.Null && !(bestOf.Type == gjson.Number && bestOf.Num == 1) {
		return nil, apierr.BadRequest("best_of", "best_of is not supported")
	}
	for _, f := range []struct {
		name string
		v    gjson.Result
	}{{"max_tokens", maxTok}, {"max_completion_tokens", maxCompl}} {
		if f.v.Exists() && f.v.Type != gjson.Null {
			if f.v.Type != gjson.Number || f.v.Num != float64(int64(f.v.Num)) || f.v.Num < 1 || f.v.Num > 1<<31 {
				return nil, apierr.BadRequest(f.name, "%s must be a positive integer", f.name)
			}
			p.maxTokens = max(p.maxTokens, int64(f.v.Num))
		}
	}
	if streamOpts.Exists() && streamOpts.Type != gjson.Null {
		if !streamOpts.IsObject() {
			return nil, apierr.BadRequest("stream_options", "stream_options must be an object")
		}
		if !p.stream {
			return nil, apierr.BadRequest("stream_options", "stream_options is only allowed when stream is true")
		}
		iu := streamOpts.Get("include_usage")
		if iu.Exists() && !isBool(iu) && iu.Type != gjson.Null {
			return nil, apierr.BadRequest("stream_options", "stream_options.include_usage must be a boolean")
		}
		p.wantUsage = iu.Type == gjson.True
		cu := streamOpts.Get("continuous_usage_stats")
		if cu.Exists() && !isBool(cu) && cu.Type != gjson.Null {
			return nil, apierr.BadRequest("stream_options", "stream_options.continuous_usage_stats must be a boolean")
		}
		p.wantContinuous = p.wantUsage && cu.Type == gjson.True
	}

	// Forward exactly what was decided: each field the gateway acts on is
	// rewritten unless its bytes already say it in the one canonical way.
	// Fields the body lacks are added together at its end, in one copy
	// (each edit in place copies the whole body).
	var (
		err     error
		tailBuf [128]byte
		tail    = tailBuf[:0] // what parseRequest adds fits: no allocation
	)
	set := func(path string, raw string, want any, canonical string) {
		if err != nil || raw == canonical {
			return
		}
		p.body, err = sjson.SetBytes(p.body, path, want)
	}
	add := func(key, raw string) {
		tail = append(append(append(append(tail, ",\""...), key...), "\":"...), raw...)
	}
	set("model", model.Raw, p.model, strconv.Quote(p.model))
	switch {
	case p.assemble && !stream.Exists():
		add("stream", "true")
	case p.assemble:
		set("stream", stream.Raw, true, "true")
	case stream.Exists():
		set("stream", stream.Raw, p.stream, strconv.FormatBool(p.stream))
	}
	if n.Exists() && n.Type != gjson.Null {
		set("n", n.Raw, int64(n.Num), strconv.FormatInt(int64(n.Num), 10))
	}
	if p.maxTokens == 0 {
		p.maxTokens = lim.defaultMax(p.model)
		var contextLen int64
		if lim.contextLen != nil {
			contextLen = lim.contextLen(p.model)
		}
		// The engine refuses a prompt that leaves less room than
		// max_tokens in its context, so the default is sent only where it
		// surely fits (a prompt is very rarely more than a token per two
		// bytes). Where it may not, max_tokens goes as null: the engine
		// gives the rest of the context, as to a client that set none
		// (vLLM's completions would otherwise stop at 16), and the whole
		// context is reserved.
		if likely := int64(len(body))/2 + 16 + media*lim.mediaPart; contextLen > 0 && likely+p.maxTokens > contextLen {
			p.maxTokens = contextLen
			if err == nil {
				p.body, err = sjson.SetRawBytes(p.body, "max_tokens", []byte("null"))
			}
		} else if maxTok.Exists() {
			set("max_tokens", "", p.maxTokens, "-")
		} else {
			add("max_tokens", strconv.FormatInt(p.maxTokens, 10))
		}
	} else {
		for _, f := range []struct {
			name string
			v    gjson.Result
		}{{"max_tokens", maxTok}, {"max_completion_tokens", maxCompl}} {
			if f.v.Exists() && f.v.Type != gjson.Null {
				set(f.name, f.v.Raw, int64(f.v.Num), strconv.FormatInt(int64(f.v.Num), 10))
			}
		}
	}
	// Usage on every chunk: an aborted stream and a cancelled hedge are
	// billed from the engine's own running count, not estimated.
	const usageOptions = `{"include_usage":true,"continuous_usage_stats":true}`
	switch {
	case p.upstreamStream() && !streamOpts.Exists():
		add("stream_options", usageOptions)
	case p.assemble && err == nil:
		// null: a JSON request has no other stream_options (refused above).
		p.body, err = sjson.SetRawBytes(p.body, "stream_options", []byte(usageOptions))
	case p.stream:
		set("stream_options.include_usage", streamOpts.Get("include_usage").Raw, true, "true")
		set("stream_options.continuous_usage_stats", streamOpts.Get("continuous_usage_stats").Raw, true, "true")
	}
	if priority.Exists() && err == nil {
		// The engine's priority would let a request jump its queue past
		// the gateway's classes: the order is the admission queue's.
		p.body, err = sjson.DeleteBytes(p.body, "priority")
	}
	if err == nil && len(tail) > 0 {
		p.body = appendFields(p.body, tail)
	}
	if err != nil {
		return nil, apierr.BadRequest("", "request body cannot be edited: %v", err)
	}
	p.prefix = prefixHash(ep, messages, prompt)
	p.session = sessionName(fields[13], fields[14])
	p.promptBound = int64(len(body)) + 16 + media*lim.mediaPart
	p.promptEstimate = int64(len(body))/4 + 1 + media*lim.mediaPart/4
	return p, nil
}

// checkJSON runs the strict check on a request body and turns its verdict
// into the client's 400: a repeated key names the key, deep nesting and too
// many keys say so, anything else is invalid JSON.
func checkJSON(body []byte, maxDepth int) error {
	err := strictjson.Check(body, maxDepth)
	if err == nil {
		return nil
	}
	var (
		dup   *strictjson.DuplicateKeyError
		depth *strictjson.DepthError
		keys  *strictjson.TooManyKeysError
	)
	switch {
	case errors.As(err, &dup):
		return apierr.BadRequest(dup.Key, "request body has %s: send each field once", err)
	case errors.As(err, &depth):
		return apierr.BadRequest("", "request body is %s", err)
	case errors.As(err, &keys):
		return apierr.BadRequest("", "request body has %s", err)
	}
	return apierr.BadRequest("", "request body is not valid JSON: %s", err)
}

// appendFields returns a copy of the JSON object obj with fields (each
// starting with a comma) added before its closing brace.
func appendFields(obj, fields []byte) []byte {
	end := bytes.LastIndexByte(obj, '}')
	head := bytes.TrimRight(obj[:end], " \t\r\n")
	if len(head) > 0 && head[len(head)-1] == '{' {
		fields = fields[1:] // an empty object: no comma before the first
	}
	out := make([]byte, 0, len(obj)+len(fields))
	out = append(append(append(out, obj[:end]...), fields...), obj[end:]...)
	return out
}

// upstreamStream reports whether the engine is asked for a stream.
func (p *parsedRequest) upstreamStream() bool { return p.stream || p.assemble }

// reservedCompletion is the completion tokens the request may produce in
// all: the cap per sequence times the sequences.
func (p *parsedRequest) reservedCompletion() int64 { return p.maxTokens * p.sequences }

func firstNonSpace(b []byte) int {
	for i, c := range b {
		switch c {
		case ' ', '\t', '\n', '\r':
		default:
			return i
		}
	}
	return 0
}

func isBool(r gjson.Result) bool { return r.Type == gjson.True || r.Type == gjson.False }

// prefixBytes is how much of the prompt's start decides prefix affinity.
const prefixBytes = 256

// prefixHash hashes what an engine's prefix cache would share between
// requests: the first message (typically the system prompt) or the start of
// a completion prompt.
func prefixHash(ep endpoint, messages, prompt gjson.Result) uint64 {
	var lead string
	if ep.chat {
		first := messages.Get("0")
		lead = first.Get("role").Str + "\x00" + first.Get("content").Raw
	} else {
		lead = prompt.Raw
	}
	if len(lead) > prefixBytes {
		lead = lead[:prefixBytes]
	}
	if lead == "" || lead == "\x00" {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(lead))
	return h.Sum64()
}
