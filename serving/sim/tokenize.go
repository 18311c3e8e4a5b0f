package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// /tokenize and /detokenize expose the simulator's tokenizer, which agrees
// with its token formulas: text is cut into chunks of four bytes, one token
// each, and a chunk's id encodes its bytes, so detokenizing gives the text
// back. Special tokens frame the prompt:
//
//	1 <s>                         begins a completions prompt (add_special_tokens)
//	2 <|im_start|> 3 <|im_end|>   frame a chat message: <|im_start|> role \n … <|im_end|>
//	4 \n
//	5 system  6 user  7 assistant  8 tool  9 developer  10 <role> (any other role)
//
// so a chat prompt is 3 + Σ(4 + ⌈bytes/4⌉) tokens (the last 3 are the
// generation prompt <|im_start|> assistant \n) and a completions prompt
// 1 + ⌈bytes/4⌉. Shapes: vllm/entrypoints/serve/tokenize/protocol.py@343bacaf
// (TokenizeResponse, DetokenizeResponse).

const (
	tokBOS      = 1
	tokImStart  = 2
	tokImEnd    = 3
	tokNewline  = 4
	tokRoleBase = 5 // system … developer
	tokRoleAny  = 10
	tokChunk    = 16 // the first chunk id
)

var specialTokens = [...]string{1: "<s>", 2: "<|im_start|>", 3: "<|im_end|>", 4: "\n",
	5: "system", 6: "user", 7: "assistant", 8: "tool", 9: "developer", 10: "<role>"}

var roleTokens = map[string]int64{"system": 5, "user": 6, "assistant": 7, "tool": 8, "developer": 9}

// chunkOffsets[n] is the first id of an n-byte chunk.
var chunkOffsets = [5]int64{0, tokChunk, tokChunk + 1<<8, tokChunk + 1<<8 + 1<<16, tokChunk + 1<<8 + 1<<16 + 1<<24}

// maxTokenID is the last id of the vocabulary.
const maxTokenID = tokChunk + 1<<8 + 1<<16 + 1<<24 + 1<<32 - 1

// appendTextTokens appends the ids of s's four-byte chunks.
func appendTextTokens(ids []int64, s string) []int64 {
	for len(s) > 0 {
		n := min(4, len(s))
		v := int64(0)
		for i := range n {
			v = v<<8 | int64(s[i])
		}
		ids = append(ids, chunkOffsets[n]+v)
		s = s[n:]
	}
	return ids
}

// tokenText returns the text of one token id, false outside the vocabulary.
func tokenText(id int64) (string, bool) {
	switch {
	case id >= 1 && id <= tokRoleAny:
		return specialTokens[id], true
	case id < tokChunk || id > maxTokenID:
		return "", false
	}
	n := 4
	for n > 1 && id < chunkOffsets[n] {
		n--
	}
	v := id - chunkOffsets[n]
	b := make([]byte, n)
	for i := n - 1; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
	return string(b), true
}

var tokenizeCompletionSpecs = []fspec{
	{name: "model", typ: tStr, nullable: true},
	{name: "prompt", typ: tStr, required: true},
	{name: "add_special_tokens", typ: tBool},
	{name: "return_token_strs", typ: tBool, nullable: true},
}

var tokenizeChatSpecs = []fspec{
	{name: "model", typ: tStr, nullable: true},
	{name: "messages", typ: tList, required: true},
	{name: "add_generation_prompt", typ: tBool},
	{name: "return_token_strs", typ: tBool, nullable: true},
	{name: "continue_final_message", typ: tBool},
	{name: "add_special_tokens", typ: tBool},
	{name: "tools", typ: tList, nullable: true},
}

func (e *Engine) handlePostTokenize(w http.ResponseWriter, r *http.Request) {
	ids, strs, aerr := e.tokenize(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if e.inject(w, r, false, nil) {
		return
	}
	b := append([]byte(nil), `{"count":`...)
	b = strconv.AppendInt(b, int64(len(ids)), 10)
	b = append(b, `,"max_model_len":`...)
	b = strconv.AppendInt(b, int64(e.cfg.MaxModelLen), 10)
	b = append(b, `,"tokens":[`...)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	b = append(b, `],"token_strs":`...)
	if strs {
		b = append(b, '[')
		for i, id := range ids {
			if i > 0 {
				b = append(b, ',')
			}
			s, _ := tokenText(id)
			b = appendJSONString(b, s)
		}
		b = append(b, "]}"...)
	} else {
		b = append(b, "null}"...)
	}
	writeJSON(w, http.StatusOK, b)
}

// tokenize validates a /tokenize body (TokenizeCompletionRequest when it has
// a prompt, else TokenizeChatRequest) and returns its token ids and whether
// the token strings were asked for.
func (e *Engine) tokenize(w http.ResponseWriter, r *http.Request) ([]int64, bool, *apiError) {
	rd, aerr := readJSONFields(w, r)
	if aerr != nil {
		return nil, false, aerr
	}
	var ids []int64
	_, hasPrompt := rd.raw["prompt"]
	_, hasMessages := rd.raw["messages"]
	switch {
	case hasPrompt:
		rd.check(tokenizeCompletionSpecs)
		if len(rd.errs) > 0 {
			return nil, false, validationError(rd.errs)
		}
		if _, set := rd.raw["add_special_tokens"]; !set || rd.bool("add_special_tokens") {
			ids = append(ids, tokBOS)
		}
		p, _ := rd.str("prompt")
		ids = appendTextTokens(ids, p)
	case hasMessages:
		if rd.truthy("continue_final_message") && rd.truthy("add_generation_prompt") {
			return nil, false, valueError(rd, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.", "")
		}
		rd.check(tokenizeChatSpecs)
		msgs := rd.checkMessages()
		if len(rd.errs) > 0 {
			return nil, false, validationError(rd.errs)
		}
		for i, m := range msgs {
			var h uint32
			if _, aerr := messageContent(m.content, i, &h, nil); aerr != nil {
				return nil, false, aerr
			}
			role, ok := roleTokens[m.role]
			if !ok {
				role = tokRoleAny
			}
			ids = append(ids, tokImStart, role, tokNewline)
			ids = appendTextTokens(ids, contentText(m.content))
			ids = append(ids, tokImEnd)
		}
		if _, set := rd.raw["add_generation_prompt"]; !set || rd.bool("add_generation_prompt") {
			ids = append(ids, tokImStart, roleTokens["assistant"], tokNewline)
		}
	default:
		return nil, false, validationError([]pyErr{
			{typ: "missing", loc: "body.TokenizeCompletionRequest.prompt", msg: "Field required", input: rd.summary()},
			{typ: "missing", loc: "body.TokenizeChatRequest.messages", msg: "Field required", input: rd.summary()},
		})
	}
	model, _ := rd.str("model")
	if aerr := e.checkModel(model); aerr != nil {
		return nil, false, aerr
	}
	if aerr := e.checkLength([]poolInput{{tokens: len(ids)}}); aerr != nil {
		return nil, false, aerr
	}
	return ids, rd.bool("return_token_strs"), nil
}

// contentText returns a valid message content's text: the string, or the
// concatenated text parts.
func contentText(raw json.RawMessage) string {
	if s, ok := asString(raw); ok {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &parts)
	var b []byte
	for _, p := range parts {
		b = append(b, p.Text...)
	}
	return string(b)
}

var detokenizeSpecs = []fspec{
	{name: "model", typ: tStr, nullable: true},
	{name: "tokens", typ: tList, required: true},
}

func (e *Engine) handlePostDetokenize(w http.ResponseWriter, r *http.Request) {
	rd, aerr := readJSONFields(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	rd.check(detokenizeSpecs)
	var ids []json.RawMessage
	_ = json.Unmarshal(rd.rawVal("tokens"), &ids)
	var text []byte
	for i, raw := range ids {
		v, errs := convert(fspec{typ: tInt}, raw, "body.tokens."+strconv.Itoa(i))
		if len(errs) > 0 {
			rd.errs = append(rd.errs, errs...)
			continue
		}
		s, ok := tokenText(v.(int64))
		if !ok && len(rd.errs) == 0 {
			writeError(w, badRequest("tokens", fmt.Sprintf("token id %d is outside the simulated vocabulary (1 to %d)", v.(int64), int64(maxTokenID))))
			return
		}
		text = append(text, s...)
	}
	if len(rd.errs) > 0 {
		writeError(w, validationError(rd.errs))
		return
	}
	model, _ := rd.str("model")
	if aerr := e.checkModel(model); aerr != nil {
		writeError(w, aerr)
		return
	}
	if e.inject(w, r, false, nil) {
		return
	}
	b := append([]byte(nil), `{"prompt":`...)
	b = appendJSONString(b, string(text))
	writeJSON(w, http.StatusOK, append(b, '}'))
}
