package server

import (
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tailgate-dev/tailgate/server/apierr"
)

// The request shapes of the endpoints beside chat, completions, Responses
// and Messages, as vLLM's request models define them: the one table the
// readers, their tests and docs/api.md's endpoint table follow. Each JSON
// endpoint is a union of request models (pydantic tries them in order);
// the gateway reads the body as the one member whose key fields it names,
// sizes that member's inputs, and refuses with a 400 naming the field:
//
//   - a body naming key fields of two members (vLLM would run one of them,
//     the gateway cannot know it sized the same one), or of none;
//   - a field the table does not list (the engine may act on it: the
//     gateway forwards only what it read);
//   - a field listed as refused: one that changes how many tokens the
//     engine runs in a way the body's size does not bound (a request
//     template, media processor settings, padding to the context).
//
// Sources (vLLM's request models, at the commits read):
// vllm/entrypoints/pooling/embed/protocol.py@ff8d577a (EmbeddingRequest),
// vllm/entrypoints/pooling/base/protocol.py@65772ef1 (the mixins: common,
// completion, chat and encoding fields),
// vllm/entrypoints/pooling/scoring/protocol.py@004706d8 (ScoreRequest,
// RerankRequest), vllm/entrypoints/serve/tokenize/protocol.py@343bacaf
// (TokenizeRequest, DetokenizeRequest).

// sizing is how a union member's inputs become prompt tokens.
type sizing uint8

const (
	// sizeInputs: every input is one prompt; a token covers at least one
	// byte of the body, so the body bounds the text, plus each media part.
	sizeInputs sizing = iota
	// sizePairs: a cross-encoder scores each (query, document) pair as one
	// prompt, the query repeated in each (1:N), or the i-th query with the
	// i-th document (N:N) — vLLM's _validate_score_input_lens.
	sizePairs
	// sizeNone: the engine runs no model (tokenize, detokenize): the body
	// bounds what it reads; it reports no usage and is billed nothing.
	sizeNone
)

// shapeMember is one request model of a union: the fields that name it
// (all required), and the fields only it has.
type shapeMember struct {
	model  string   // vLLM's class name
	keys   []string // required fields naming it; for sizePairs: the queries side, then the documents side
	fields []string // its other fields, options
	size   sizing
	// single: the first key takes one input only (rerank's query,
	// tokenize's prompt).
	single bool
}

// endpointShape is the request model of one or more public paths.
type endpointShape struct {
	paths   []string
	source  string        // vLLM's file@commit of the request model
	members []shapeMember // the union, in vLLM's order
	// options are fields every member has that change no token count.
	options []string
	// refused are fields the gateway cannot size: why, for the 400.
	refused map[string]string
}

// poolingCommon are PoolingBasicRequestMixin's fields
// (vllm/entrypoints/pooling/base/protocol.py@65772ef1); priority is read
// by readJSONObject (removed: the admission queue orders requests).
var poolingCommon = []string{"model", "user", "truncate_prompt_tokens", "truncation_side", "request_id", "priority", "cache_salt", "use_activation", "softmax", "activation", "normalize"}

// chatOptions are ChatRequestOptionsMixin's fields that change no count.
var chatOptions = []string{"add_generation_prompt", "continue_final_message", "add_special_tokens", "chat_template_kwargs", "tools"}

// sizeRefused are fields whose effect on the prompt the body does not bound.
var sizeRefused = map[string]string{
	"chat_template":       "a request's own chat template can make the prompt any size; the gateway cannot bound it",
	"mm_processor_kwargs": "media processor settings change how many tokens a media part is; the gateway cannot bound it",
	"media_io_kwargs":     "media loading settings (frames, sample rate) change how many tokens a media part is; the gateway cannot bound it",
	"padding":             "padding pads a prompt up to the context; the gateway reserves what the body holds",
}

// shapes is the table: every JSON endpoint beside chat, completions,
// Responses and Messages. Tests walk it; docs/api.md states it.
var shapes = []endpointShape{
	{
		paths:  []string{"/v1/embeddings"},
		source: "vllm/entrypoints/pooling/embed/protocol.py@ff8d577a EmbeddingRequest",
		members: []shapeMember{
			{model: "EmbeddingCompletionRequest", keys: []string{"input"}, fields: []string{"add_special_tokens"}},
			{model: "EmbeddingChatRequest", keys: []string{"messages"}, fields: chatOptions},
		},
		options: append([]string{"encoding_format", "dimensions", "embed_dtype", "endianness"}, poolingCommon...),
		refused: sizeRefused,
	},
	{
		paths:  []string{"/v1/rerank", "/rerank", "/v2/rerank"},
		source: "vllm/entrypoints/pooling/scoring/protocol.py@004706d8 RerankRequest",
		members: []shapeMember{
			// return_documents, max_chunks_per_doc, rank_fields: Jina and
			// Cohere clients send them; vLLM ignores them (extra fields).
			{model: "RerankRequest", keys: []string{"query", "documents"}, fields: []string{"top_n", "return_documents", "max_chunks_per_doc", "rank_fields"}, size: sizePairs, single: true},
		},
		options: poolingCommon,
		refused: sizeRefused,
	},
	{
		paths:  []string{"/v1/score", "/score"},
		source: "vllm/entrypoints/pooling/scoring/protocol.py@004706d8 ScoreRequest",
		members: []shapeMember{
			{model: "ScoreQueriesDocumentsRequest", keys: []string{"queries", "documents"}, size: sizePairs},
			{model: "ScoreQueriesItemsRequest", keys: []string{"queries", "items"}, size: sizePairs},
			{model: "ScoreDataRequest", keys: []string{"data_1", "data_2"}, size: sizePairs},
			{model: "ScoreTextRequest", keys: []string{"text_1", "text_2"}, size: sizePairs},
		},
		options: poolingCommon,
		refused: sizeRefused,
	},
	{
		paths:  []string{"/tokenize"},
		source: "vllm/entrypoints/serve/tokenize/protocol.py@343bacaf TokenizeRequest",
		members: []shapeMember{
			{model: "TokenizeCompletionRequest", keys: []string{"prompt"}, fields: []string{"add_special_tokens"}, size: sizeNone, single: true},
			{model: "TokenizeChatRequest", keys: []string{"messages"}, fields: chatOptions, size: sizeNone},
		},
		options: []string{"model", "return_token_strs"},
		refused: sizeRefused,
	},
	{
		paths:  []string{"/detokenize"},
		source: "vllm/entrypoints/serve/tokenize/protocol.py@343bacaf DetokenizeRequest",
		members: []shapeMember{
			{model: "DetokenizeRequest", keys: []string{"tokens"}, size: sizeNone},
		},
		options: []string{"model"},
	},
}

// shapeFor returns the shape of a public path, or nil.
func shapeFor(path string) *endpointShape {
	for i := range shapes {
		for _, p := range shapes[i].paths {
			if p == path {
				return &shapes[i]
			}
		}
	}
	return nil
}

// member picks the union member a body names: the one whose key fields it
// has, all of them, and no key field of another.
func (sh *endpointShape) member(v gjson.Result) (*shapeMember, error) {
	var picked *shapeMember
	for i := range sh.members {
		m := &sh.members[i]
		all := true
		for _, k := range m.keys {
			all = all && present(v.Get(k))
		}
		if all && picked == nil {
			picked = m
		}
	}
	if picked == nil {
		return nil, apierr.BadRequest(sh.members[0].keys[0], "send one of: %s", sh.memberList())
	}
	for i := range sh.members {
		for _, k := range sh.members[i].keys {
			if present(v.Get(k)) && !contains(picked.keys, k) {
				return nil, apierr.BadRequest(k, "the body names %s of %s beside %s of %s; send the fields of one request shape only (%s)",
					k, sh.members[i].model, strings.Join(picked.keys, " and "), picked.model, sh.memberList())
			}
		}
	}
	return picked, nil
}

// memberList names the union's members by their key fields.
func (sh *endpointShape) memberList() string {
	var b strings.Builder
	for i, m := range sh.members {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strings.Join(m.keys, "+"))
	}
	return b.String()
}

// checkFields refuses a field the member does not have, or one the
// gateway cannot size.
func (sh *endpointShape) checkFields(m *shapeMember, v gjson.Result) error {
	var err error
	v.ForEach(func(k, _ gjson.Result) bool {
		name := k.Str
		if why, ok := sh.refused[name]; ok {
			err = apierr.BadRequest(name, "%s is not served through the gateway: %s", name, why)
			return false
		}
		// stream and priority: read by readJSONObject on every endpoint.
		if !contains(m.keys, name) && !contains(m.fields, name) && !contains(sh.options, name) && name != "stream" && name != "priority" {
			err = apierr.BadRequest(name, "%s is not a field of %s (%s) that the gateway reads; remove it", name, m.model, sh.source)
			return false
		}
		return true
	})
	return err
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// inputSide is one side of a request's inputs as the engine reads it: how many
// inputs, their bytes in the body and their media parts.
type inputSide struct {
	n, bytes, media int64
}

// readSide sizes a field of inputs: a string, a list of strings or token
// ids, a list of those, a multimodal {"content": [parts]} object, or a list
// of content parts or of such objects. single: the field is one input even
// when it is a list of parts.
func readSide(r gjson.Result, single bool) inputSide {
	var s inputSide
	if !present(r) {
		return s
	}
	one := func(x gjson.Result) {
		s.n++
		s.bytes += int64(len(x.Raw))
		s.media += nestedMediaParts(x)
	}
	switch {
	case r.IsArray() && !single && !isPartList(r):
		r.ForEach(func(_, x gjson.Result) bool {
			one(x)
			return true
		})
	default:
		one(r)
	}
	return s
}

// isPartList reports whether a list is one input's content parts (objects
// with a type), not a list of inputs; a list of token ids is one input too.
func isPartList(r gjson.Result) bool {
	first := r.Get("0")
	return first.Type == gjson.Number || (first.IsObject() && first.Get("type").Exists())
}

// mediaTypes are the content parts the engine fetches or decodes
// (vllm/entrypoints/chat_utils.py's part parsers: image, audio, video, and
// their embeddings), each reserved as a chat message's media part is.
var mediaTypes = map[string]bool{
	"image_url": true, "image_embeds": true, "image_pil": true, "image": true, "input_image": true,
	"audio_url": true, "input_audio": true, "audio_embeds": true, "audio": true,
	"video_url": true, "video": true, "file": true, "input_file": true,
}

// nestedMediaParts counts the media parts anywhere in v (parts nest in messages'
// content and in multimodal score inputs).
func nestedMediaParts(v gjson.Result) int64 {
	var n int64
	var walk func(x gjson.Result, depth int)
	walk = func(x gjson.Result, depth int) {
		if depth > 8 || !(x.IsObject() || x.IsArray()) {
			return
		}
		if x.IsObject() {
			if t := x.Get("type"); t.Type == gjson.String && mediaTypes[t.Str] {
				n++
				return
			}
		}
		x.ForEach(func(_, y gjson.Result) bool {
			walk(y, depth+1)
			return true
		})
	}
	walk(v, 0)
	return n
}

// specialTokens are the tokens a tokenizer may add to each input beyond
// its bytes (BOS, EOS, a pair's separators): room, as chat's 16 a prompt.
const specialTokens = 4

// readShaped reads a body of one of the endpoints in shapes: the member it
// names, every field checked against the table, and the prompt reserved as
// the member's sizing says.
func readShaped(ep endpoint, body []byte, _ string, lim parseLimits) (*parsedRequest, error) {
	pr, v, err := readJSONObject(ep, body, lim)
	if err != nil {
		return nil, err
	}
	sh := shapeFor(ep.path)
	m, err := sh.member(v)
	if err != nil {
		return nil, err
	}
	if err := sh.checkFields(m, v); err != nil {
		return nil, err
	}
	var bound, media int64
	switch m.size {
	case sizeNone, sizeInputs:
		in := readSide(v.Get(m.keys[0]), m.single || m.keys[0] == "messages")
		bound, media = int64(len(body))+specialTokens*max(in.n, 1), in.media
	case sizePairs:
		q, d := readSide(v.Get(m.keys[0]), m.single), readSide(v.Get(m.keys[1]), false)
		pairs := max(q.n, d.n, 1)
		if q.n <= 1 { // one query scored with each document
			bound = q.bytes*pairs + d.bytes
			media = q.media*pairs + d.media
		} else { // the i-th query with the i-th document
			bound, media = q.bytes+d.bytes, q.media+d.media
		}
		bound += pairs * specialTokens
	}
	pr.promptBound = max(pr.promptBound, bound) + media*lim.mediaPart
	pr.promptEstimate = max(pr.promptEstimate, bound/4+1) + media*lim.mediaPart/4
	if m.size == sizeNone {
		// Nothing runs on the model: nothing to hold against the budget
		// beyond what the body holds.
		pr.promptBound, pr.promptEstimate = int64(len(body))+16, 0
	}
	return pr, nil
}
