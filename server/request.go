package server

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
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
	// wholeHedge: a JSON answer relayed whole may still be hedged on its
	// time (chat, completions); the other endpoints' are not.
	wholeHedge bool
	// saltRead: the reader looked for the client's cache_salt, and
	// saltSent says whether the body has one (saltRequest need not look).
	saltRead, saltSent bool
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
	"use_beam_search", "prompt_logprobs", "tool_choice", "priority", "prompt_cache_key", "user", "cache_salt"}

// readFields returns the members of the JSON object body named in
// requestFields (a zero Result for one it lacks), in one walk of the
// object, as gjson reads them — except that of the members read only as
// raw JSON (messages, prompt) a string's Str is left empty: decoding a
// long prompt's escapes would copy it for nothing. The body passed
// strictjson.Check (so no key repeats), which lets the walk step over each
// value without checking it again: over a string with bytes.IndexByte,
// where gjson looked at each byte (gjson.GetMany walked the body once for
// each name: 15 walks, 3 % of the gateway's CPU at 1000 small JSON requests
// a second; a single gjson walk still cost a 256 KB prompt 4 passes over its
// bytes, BenchmarkBigPromptRead).
func readFields(body string) (f [len(requestFields)]gjson.Result) {
	strictjson.Members(bytesOf(body), func(key, v []byte) bool {
		for i, n := range requestFields {
			if string(key) == n {
				if !f[i].Exists() {
					f[i] = result(stringOf(v), i == fMessages || i == fPrompt)
				}
				break
			}
		}
		return true
	})
	return f
}

// result is gjson's reading of raw, one value of a checked body; rawOnly
// leaves a string's Str empty. (Index is not set: nothing here reads it.)
func result(raw string, rawOnly bool) gjson.Result {
	if len(raw) == 0 || raw[0] != '"' {
		return gjson.Parse(raw) // a container's Raw is raw whole, unscanned
	}
	r := gjson.Result{Type: gjson.String, Raw: raw}
	switch {
	case rawOnly:
	case strings.IndexByte(raw, '\\') < 0:
		r.Str = raw[1 : len(raw)-1]
	default:
		r.Str = gjson.Parse(raw).Str // escapes decoded
	}
	return r
}

// bytesOf and stringOf view a string as bytes and bytes as a string
// without copying; neither side is written while the view is in use.
func bytesOf(s string) []byte  { return unsafe.Slice(unsafe.StringData(s), len(s)) }
func stringOf(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

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

// Indices of readFields' result.
const (
	fModel = iota
	fStream
	fMaxTokens
	fMaxCompletionTokens
	fStreamOptions
	fMessages
	fPrompt
	fN
	fBestOf
	fBeamSearch
	fPromptLogprobs
	fToolChoice
	fPriority
	fPromptCacheKey
	fUser
	fCacheSalt
)

// genFields are a generation request's members, as readFields returns them.
type genFields = [len(requestFields)]gjson.Result

// parseRequest validates body for ep and prepares what is sent upstream,
// through the endpoint's reader: the body must read one way only (no
// repeated key, bounded nesting); the fields the gateway acts on are checked
// and rewritten in canonical form; the default output cap is applied when
// the client set none, and streams always ask upstream for usage (stripped
// again if the client did not ask).
func parseRequest(ep endpoint, body []byte, ctype string, lim parseLimits) (*parsedRequest, error) {
	return ep.read(ep, body, ctype, lim)
}

// readChat reads a chat completion request: the fields every generation
// request shares (readGeneration, finishGeneration) around its messages.
func readChat(ep endpoint, body []byte, _ string, lim parseLimits) (*parsedRequest, error) {
	p, f, err := readGeneration(body, lim)
	if err != nil {
		return nil, err
	}
	media, lead, err := readChatMessages(f[fMessages])
	if err != nil {
		return nil, err
	}
	if err := p.finishGeneration(ep, &f, media, lim); err != nil {
		return nil, err
	}
	// The first message (typically the system prompt): its role, a zero
	// byte, then its content's JSON.
	p.prefix = prefixHash(lead.role, "\x00", lead.content)
	return p, nil
}

// readCompletions reads a completion request: as readChat, around its
// prompt (or list of prompts).
func readCompletions(ep endpoint, body []byte, _ string, lim parseLimits) (*parsedRequest, error) {
	p, f, err := readGeneration(body, lim)
	if err != nil {
		return nil, err
	}
	if p.sequences, err = readPrompts(f[fPrompt]); err != nil {
		return nil, err
	}
	if err := p.finishGeneration(ep, &f, 0, lim); err != nil {
		return nil, err
	}
	p.prefix = prefixHash("", "", f[fPrompt].Raw) // the prompt's start
	return p, nil
}

// readGeneration checks a chat or completion body (one reading only,
// bounded nesting, an object), reads its members in one walk, and decides
// what the engine is asked for: model, stream, and whether a JSON answer is
// assembled from a stream (see parsedRequest.assemble) — the adapter's
// choice, made here.
func readGeneration(body []byte, lim parseLimits) (*parsedRequest, genFields, error) {
	var f genFields
	if len(body) == 0 {
		return nil, f, apierr.BadRequest("", "request body is empty; send a JSON object")
	}
	if err := checkJSON(body, lim.maxDepth); err != nil {
		return nil, f, err
	}
	if body[firstNonSpace(body)] != '{' {
		return nil, f, apierr.BadRequest("", "request body must be a JSON object")
	}
	// gjson over a string view of the body: results alias it instead of
	// copying (a 4 MiB messages array would otherwise be copied whole).
	f = readFields(stringOf(body))
	p := &parsedRequest{body: body, sequences: 1, wholeHedge: true}
	switch model := f[fModel]; {
	case !model.Exists():
		return nil, f, apierr.BadRequest("model", "you must provide a model parameter")
	case model.Type != gjson.String || model.Str == "":
		return nil, f, apierr.BadRequest("model", "model must be a non-empty string")
	default:
		p.model = model.Str
	}
	if stream := f[fStream]; present(stream) && !isBool(stream) {
		return nil, f, apierr.BadRequest("stream", "stream must be a boolean")
	}
	p.stream = f[fStream].Type == gjson.True
	p.assemble = !p.stream && f[fBeamSearch].Type != gjson.True && f[fPromptLogprobs].Type == gjson.Null &&
		(lim.alternatives == nil || lim.alternatives(p.model))
	tc := f[fToolChoice]
	p.forcedTool = tc.IsObject() || tc.Type == gjson.String && tc.Str == "required"
	return p, f, nil
}

// readChatMessages checks a chat request's messages (a non-empty array of
// objects with a string role) and counts their media parts (images, audio,
// video, files), each reserved as Config.MediaPartTokens of prompt; lead
// is the first message's role and content (its JSON), for prefixHash.
// The body passed strictjson.Check: the walk steps over each message's
// content instead of reading it (a 256 KB prompt was read three times).
func readChatMessages(messages gjson.Result) (media int64, lead messageLead, err error) {
	if !messages.Exists() {
		return 0, lead, apierr.BadRequest("messages", "you must provide a messages parameter")
	}
	if !messages.IsArray() {
		return 0, lead, apierr.BadRequest("messages", "messages must be a non-empty array")
	}
	i := 0
	strictjson.Elements(bytesOf(messages.Raw), func(m []byte) bool {
		var role, content []byte // nil: none
		strictjson.Members(m, func(k, v []byte) bool {
			switch {
			case role == nil && string(k) == "role":
				role = v
			case content == nil && string(k) == "content":
				content = v
			}
			return true
		})
		if m[0] != '{' || len(role) == 0 || role[0] != '"' {
			err = apierr.BadRequest("messages", "messages[%d] must be an object with a string role", i)
			return false
		}
		if len(content) > 0 && content[0] == '[' {
			media += mediaParts(content)
		}
		if i == 0 {
			lead = messageLead{role: result(stringOf(role), false).Str, content: stringOf(content)}
		}
		i++
		return true
	})
	if err == nil && i == 0 {
		err = apierr.BadRequest("messages", "messages must be a non-empty array")
	}
	return media, lead, err
}

// messageLead is a chat message's role and the JSON of its content.
type messageLead struct{ role, content string }

// mediaParts counts the parts of a chat message's content (a JSON array)
// that are not text (image_url, input_audio, audio_url, video_url, file,
// …): those whose type is not a string among "text", "refusal" and "".
func mediaParts(content []byte) (n int64) {
	strictjson.Elements(content, func(part []byte) bool {
		var typ string
		strictjson.Members(part, func(k, v []byte) bool {
			if string(k) == "type" {
				typ = result(stringOf(v), false).Str
				return false
			}
			return true
		})
		switch typ {
		case "text", "refusal", "":
		default:
			n++
		}
		return true
	})
	return n
}

// readPrompts checks a completion request's prompt and returns how many
// prompts it holds: a list of strings or of token-id lists is one request
// per prompt; a string or a flat list of token ids is one prompt.
func readPrompts(prompt gjson.Result) (int64, error) {
	if !prompt.Exists() {
		return 0, apierr.BadRequest("prompt", "you must provide a prompt parameter")
	}
	if prompt.Type != gjson.String && !prompt.IsArray() {
		return 0, apierr.BadRequest("prompt", "prompt must be a string or an array")
	}
	if !prompt.IsArray() {
		return 1, nil
	}
	var k int64 // the elements, once the first is a string or a list
	strictjson.Elements(bytesOf(prompt.Raw), func(v []byte) bool {
		if k == 0 && v[0] != '"' && v[0] != '[' {
			return false
		}
		k++
		return true
	})
	if k > maxPrompts {
		return 0, apierr.BadRequest("prompt", "at most %d prompts in one request", maxPrompts)
	}
	return max(k, 1), nil
}

// finishGeneration reads what chat and completions share after their
// prompt — n, best_of, the output caps, stream_options — rewrites the body
// to say what was decided, and sizes the prompt (media parts reserved as
// lim.mediaPart each).
func (p *parsedRequest) finishGeneration(ep endpoint, f *genFields, media int64, lim parseLimits) error {
	size := int64(len(p.body)) // as the client sent it
	if err := p.readN(f[fN], f[fBestOf]); err != nil {
		return err
	}
	if err := p.readMaxTokens(f[fMaxTokens], f[fMaxCompletionTokens]); err != nil {
		return err
	}
	if err := p.readStreamOptions(f[fStreamOptions]); err != nil {
		return err
	}
	if err := p.rewrite(f, media, size, lim); err != nil {
		return err
	}
	p.session = sessionName(f[fPromptCacheKey], f[fUser])
	p.saltRead, p.saltSent = true, f[fCacheSalt].Exists()
	p.promptBound = size + 16 + media*lim.mediaPart
	p.promptEstimate = size/4 + 1 + media*lim.mediaPart/4
	return nil
}

// readN reads n (completions per prompt) into the sequences generated;
// best_of is refused unless 1.
func (p *parsedRequest) readN(n, bestOf gjson.Result) error {
	if present(n) {
		if !isCount(n, maxN) {
			return apierr.BadRequest("n", "n must be an integer from 1 to %d", maxN)
		}
		p.sequences *= int64(n.Num)
	}
	if present(bestOf) && !(bestOf.Type == gjson.Number && bestOf.Num == 1) {
		return apierr.BadRequest("best_of", "best_of is not supported")
	}
	return nil
}

// readMaxTokens reads max_tokens and max_completion_tokens: the larger one
// set is the cap per sequence (0 when neither is).
func (p *parsedRequest) readMaxTokens(maxTok, maxCompl gjson.Result) error {
	for _, f := range [...]struct {
		name string
		v    gjson.Result
	}{{"max_tokens", maxTok}, {"max_completion_tokens", maxCompl}} {
		if !present(f.v) {
			continue
		}
		if !isCount(f.v, 1<<31) {
			return apierr.BadRequest(f.name, "%s must be a positive integer", f.name)
		}
		p.maxTokens = max(p.maxTokens, int64(f.v.Num))
	}
	return nil
}

// readStreamOptions reads stream_options (only with stream: true): whether
// the client wants the usage chunk, and usage on every chunk too.
func (p *parsedRequest) readStreamOptions(opts gjson.Result) error {
	if !present(opts) {
		return nil
	}
	if !opts.IsObject() {
		return apierr.BadRequest("stream_options", "stream_options must be an object")
	}
	if !p.stream {
		return apierr.BadRequest("stream_options", "stream_options is only allowed when stream is true")
	}
	iu := opts.Get("include_usage")
	if present(iu) && !isBool(iu) {
		return apierr.BadRequest("stream_options", "stream_options.include_usage must be a boolean")
	}
	p.wantUsage = iu.Type == gjson.True
	cu := opts.Get("continuous_usage_stats")
	if present(cu) && !isBool(cu) {
		return apierr.BadRequest("stream_options", "stream_options.continuous_usage_stats must be a boolean")
	}
	p.wantContinuous = p.wantUsage && cu.Type == gjson.True
	return nil
}

// rewrite forwards exactly what was decided: each field the gateway acts on
// is rewritten unless its bytes already say it in the one canonical way.
// size is the body's length as the client sent it.
func (p *parsedRequest) rewrite(f *genFields, media, size int64, lim parseLimits) error {
	var buf [128]byte // what is added fits: no allocation
	tail := buf[:0]   // members to add, each starting with a comma
	e := bodyEdit{body: p.body}
	model, stream, n := f[fModel], f[fStream], f[fN]
	e.set("model", model.Raw, p.model, strconv.Quote(p.model))
	switch {
	case p.assemble && !stream.Exists():
		tail = appendMember(tail, "stream", "true")
	case p.assemble:
		e.set("stream", stream.Raw, true, "true")
	case stream.Exists():
		e.set("stream", stream.Raw, p.stream, strconv.FormatBool(p.stream))
	}
	if present(n) {
		e.set("n", n.Raw, int64(n.Num), strconv.FormatInt(int64(n.Num), 10))
	}
	if v := p.capOutput(&e, f[fMaxTokens], f[fMaxCompletionTokens], media, size, lim); v != "" {
		tail = appendMember(tail, "max_tokens", v)
	}
	if p.askUsage(&e, f[fStreamOptions]) {
		tail = appendMember(tail, "stream_options", usageOptions)
	}
	if f[fPriority].Exists() {
		// The engine's priority would let a request jump its queue past
		// the gateway's classes: the order is the admission queue's.
		e.del("priority")
	}
	body, err := e.done(tail)
	if err != nil {
		return apierr.BadRequest("", "request body cannot be edited: %v", err)
	}
	p.body = body
	return nil
}

// capOutput writes the output cap in force: the client's, canonical; else
// the model's default where it surely fits in the context. The engine
// refuses a prompt that leaves less room than max_tokens in its context,
// so the default is sent only where it surely fits (a prompt is very
// rarely more than a token per two bytes). Where it may not, max_tokens
// goes as null: the engine gives the rest of the context, as to a client
// that set none (vLLM's completions would otherwise stop at 16), and the
// whole context is reserved. It returns the max_tokens to add to a body
// that lacks the member ("" for none).
func (p *parsedRequest) capOutput(e *bodyEdit, maxTok, maxCompl gjson.Result, media, size int64, lim parseLimits) string {
	if p.maxTokens != 0 {
		if present(maxTok) {
			e.set("max_tokens", maxTok.Raw, int64(maxTok.Num), strconv.FormatInt(int64(maxTok.Num), 10))
		}
		if present(maxCompl) {
			e.set("max_completion_tokens", maxCompl.Raw, int64(maxCompl.Num), strconv.FormatInt(int64(maxCompl.Num), 10))
		}
		return ""
	}
	p.maxTokens = lim.defaultMax(p.model)
	var contextLen int64
	if lim.contextLen != nil {
		contextLen = lim.contextLen(p.model)
	}
	switch likely := size/2 + 16 + media*lim.mediaPart; {
	case contextLen > 0 && likely+p.maxTokens > contextLen:
		p.maxTokens = contextLen
		e.setRaw("max_tokens", "null")
	case maxTok.Exists():
		e.set("max_tokens", "", p.maxTokens, "-")
	default:
		return strconv.FormatInt(p.maxTokens, 10)
	}
	return ""
}

// usageOptions asks a stream for usage on every chunk: an aborted stream
// and a cancelled hedge are billed from the engine's own running count,
// not estimated.
const usageOptions = `{"include_usage":true,"continuous_usage_stats":true}`

// askUsage makes every stream the engine sends carry usage on every chunk;
// add: stream_options is to be added to a body that lacks it.
func (p *parsedRequest) askUsage(e *bodyEdit, opts gjson.Result) (add bool) {
	switch {
	case p.upstreamStream() && !opts.Exists():
		return true
	case p.assemble:
		// null: a JSON request has no other stream_options (refused).
		e.setRaw("stream_options", usageOptions)
	case p.stream:
		e.set("stream_options.include_usage", opts.Get("include_usage").Raw, true, "true")
		e.set("stream_options.continuous_usage_stats", opts.Get("continuous_usage_stats").Raw, true, "true")
	}
	return false
}

// bodyEdit edits a JSON body: a member the body has is rewritten in place;
// members it lacks are added together at its end (done), in one copy (each
// edit in place copies the whole body). The first error stops every later
// edit.
type bodyEdit struct {
	body []byte
	err  error
}

// set writes want at path unless raw (its bytes now) is canonical already.
func (e *bodyEdit) set(path, raw string, want any, canonical string) {
	if e.err != nil || raw == canonical {
		return
	}
	e.body, e.err = sjson.SetBytes(e.body, path, want)
}

// setRaw writes the JSON value raw at path.
func (e *bodyEdit) setRaw(path, raw string) {
	if e.err == nil {
		e.body, e.err = sjson.SetRawBytes(e.body, path, []byte(raw))
	}
}

func (e *bodyEdit) del(path string) {
	if e.err == nil {
		e.body, e.err = sjson.DeleteBytes(e.body, path)
	}
}

// appendMember appends the member key, a JSON value raw, to members to add
// (see bodyEdit.done).
func appendMember(tail []byte, key, raw string) []byte {
	return append(append(append(append(tail, ",\""...), key...), "\":"...), raw...)
}

// done returns the edited body, with the members of tail added.
func (e *bodyEdit) done(tail []byte) ([]byte, error) {
	if e.err == nil && len(tail) > 0 {
		e.body = appendFields(e.body, tail)
	}
	return e.body, e.err
}

// present reports whether a member is set: it exists and is not null.
func present(r gjson.Result) bool { return r.Exists() && r.Type != gjson.Null }

// isCount reports whether r is an integer from 1 to most.
func isCount(r gjson.Result, most float64) bool {
	return r.Type == gjson.Number && r.Num == float64(int64(r.Num)) && r.Num >= 1 && r.Num <= most
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
// requests: the first prefixBytes of the parts joined (of a chat request,
// the first message's role, a zero byte and its content's JSON; of a
// completion, the prompt's JSON), FNV-1a, 0 for nothing but the
// separator. The parts are hashed where they are: joined first, a long
// prompt was copied whole to hash its first 256 bytes.
func prefixHash(role, sep, content string) uint64 {
	if role == "" && content == "" {
		return 0
	}
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h, left := uint64(offset64), prefixBytes
	for _, part := range [...]string{role, sep, content} {
		part = part[:min(len(part), left)]
		for i := 0; i < len(part); i++ {
			h ^= uint64(part[i])
			h *= prime64
		}
		left -= len(part)
	}
	return h
}
