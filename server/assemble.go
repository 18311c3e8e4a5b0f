package server

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/serving/sse"
)

// The gateway asks the engine for a stream even when the client asked for
// JSON, so every request is hedged on its first token (DESIGN: hedging
// triggers on time to first token). The assembler turns that stream back
// into the answer the engine gives a request that is not streamed, field
// for field as vLLM writes it: model_dump() of its response model, so every
// field, nulls included, in the models' order:
//
//   - chat: vllm/entrypoints/openai/chat_completion/protocol.py@002032ee
//     (ChatCompletionResponse, ChatCompletionResponseChoice, ChatMessage;
//     tool_calls dropped when empty) and chat_completion/serving.py
//     (chat_completion_full_generator: content "" beside the calls of a
//     named or required tool_choice, null when an auto call or a reasoning
//     phase left no text);
//   - completions: vllm/entrypoints/openai/completion/protocol.py@002032ee;
//   - usage: vllm/entrypoints/serve/engine/protocol.py@f1bf7bd0 (UsageInfo).
//
// Strings are concatenated as the engine escaped them (the bytes between
// the quotes of each piece), so nothing is decoded and encoded again, and a
// character split across two chunks as a surrogate pair stays whole.

// assembler accumulates one stream's chunks into its JSON answer.
type assembler struct {
	chat bool
	// forcedTool: tool_choice was "required" or named, so a message with
	// tool calls has content "" (vLLM's full generator), not null.
	forcedTool bool

	id, created, model string // raw JSON values of the first chunk
	fingerprint        string // the last non-null system_fingerprint
	usage              string // the usage-only chunk's usage object
	metrics            string
	promptTokenIDs     string // chat: top level, on the role chunk
	promptText         string
	// Which names the engine gave reasoning deltas: "reasoning" (vLLM ≥
	// 0.12), "reasoning_content" (≤ 0.10) or both (0.11 to 0.1x).
	reasoning, reasoningContent bool

	choices []*asmChoice // by index
}

// asmChoice is one choice as far as it has come.
type asmChoice struct {
	seen         bool
	role         string // raw
	content      []byte // escaped, without quotes (chat content, completions text)
	reasoning    []byte
	hasReasoning bool
	refusal      []byte
	hasRefusal   bool
	toolCalls    []*asmToolCall // by the delta's index
	logprobs     []asmList      // per key, in the order first seen; nil: all null
	hasLogprobs  bool
	finish       string // raw; "" means null
	stop         string // raw
	tokenIDs     asmList
	hasTokenIDs  bool
	promptIDs    string // completions: raw prompt_token_ids
}

type asmToolCall struct {
	id, typ   string // raw
	name      []byte
	arguments []byte
}

// asmList is the elements of a JSON array, concatenated chunk after chunk.
type asmList struct {
	key   string
	elems []byte // raw elements, comma-separated
}

func (l *asmList) add(arr gjson.Result) {
	inner := strings.TrimSpace(arr.Raw[1 : len(arr.Raw)-1])
	if len(inner) == 0 {
		return
	}
	if len(l.elems) > 0 {
		l.elems = append(l.elems, ',')
	}
	l.elems = append(l.elems, inner...)
}

func newAssembler(ep endpoint, forcedTool bool) *assembler {
	return &assembler{chat: ep.chat, forcedTool: forcedTool}
}

// chunkUsage is what one chunk said of usage: its usage object (if any),
// whether it had no choice (the usage-only chunk) and its first choice's
// index. Valid until the chunk's payload is reused.
type chunkUsage struct {
	usage     gjson.Result
	usageOnly bool
	index     int64
}

// add takes one data payload of the stream (neither [DONE] nor an error).
// payload may be reused once add returns: it is parsed in place, and what
// the answer keeps of it is copied (keep, or appended to the choice's bytes).
// It returns what the chunk said of usage, read in the same pass.
func (a *assembler) add(payload []byte) (cu chunkUsage) {
	v := gjson.Parse(stringOf(payload))
	if !v.IsObject() {
		return cu
	}
	var usage gjson.Result
	usageOnly := false
	v.ForEach(func(k, f gjson.Result) bool {
		switch k.Str {
		case "usage":
			usage = f
		case "id":
			if a.id == "" {
				a.id = keep(f.Raw)
			}
		case "created":
			if a.created == "" {
				a.created = keep(f.Raw)
			}
		case "model":
			if a.model == "" {
				a.model = keep(f.Raw)
			}
		case "system_fingerprint":
			if f.Type != gjson.Null && f.Raw != a.fingerprint {
				a.fingerprint = keep(f.Raw)
			}
		case "metrics":
			if f.Type != gjson.Null && f.Raw != a.metrics {
				a.metrics = keep(f.Raw)
			}
		case "prompt_token_ids":
			if f.Type != gjson.Null && a.promptTokenIDs == "" {
				a.promptTokenIDs = keep(f.Raw)
			}
		case "prompt_text":
			if f.Type != gjson.Null && a.promptText == "" {
				a.promptText = keep(f.Raw)
			}
		case "choices":
			n := 0
			f.ForEach(func(_, c gjson.Result) bool {
				i := a.addChoice(c)
				if n == 0 {
					cu.index = i
				}
				n++
				return true
			})
			usageOnly = n == 0
		}
		return true
	})
	// Every chunk carries the running usage (continuous usage, and per
	// choice with n > 1); the usage-only chunk at the end has the totals.
	if usageOnly && usage.IsObject() {
		a.usage = keep(usage.Raw)
	}
	cu.usage, cu.usageOnly = usage, usageOnly
	return cu
}

func (a *assembler) choice(i int64) *asmChoice {
	if i < 0 || i > maxN*maxPrompts {
		i = 0 // an index no request can have: keep it bounded
	}
	for int64(len(a.choices)) <= i {
		a.choices = append(a.choices, &asmChoice{})
	}
	c := a.choices[i]
	c.seen = true
	return c
}

// addChoice adds one choice of a chunk and returns its index.
func (a *assembler) addChoice(v gjson.Result) int64 {
	i := v.Get("index").Int()
	c := a.choice(i)
	v.ForEach(func(k, f gjson.Result) bool {
		switch k.Str {
		case "delta", "message":
			a.addDelta(c, f)
		case "text":
			appendRawString(&c.content, f)
		case "logprobs":
			if f.IsObject() {
				c.hasLogprobs = true
				f.ForEach(func(lk, lv gjson.Result) bool {
					l := listFor(&c.logprobs, lk.Str)
					if lv.IsArray() {
						l.add(lv)
					}
					return true
				})
			}
		case "finish_reason":
			if f.Type != gjson.Null && f.Raw != c.finish {
				c.finish = keep(f.Raw)
			}
		case "stop_reason":
			// A null before the finish says null ("" renders as null);
			// after it, a null does not undo the reason.
			switch {
			case f.Type != gjson.Null && f.Raw != c.stop:
				c.stop = keep(f.Raw)
			case f.Type == gjson.Null && c.finish == "":
				c.stop = ""
			}
		case "token_ids":
			if f.IsArray() {
				c.hasTokenIDs = true
				c.tokenIDs.add(f)
			}
		case "prompt_token_ids":
			if f.Type != gjson.Null && c.promptIDs == "" {
				c.promptIDs = keep(f.Raw)
			}
		}
		return true
	})
	return i
}

func (a *assembler) addDelta(c *asmChoice, d gjson.Result) {
	d.ForEach(func(k, f gjson.Result) bool {
		switch k.Str {
		case "role":
			if f.Type == gjson.String && f.Raw != c.role {
				c.role = keep(f.Raw)
			}
		case "content":
			appendRawString(&c.content, f)
		case "reasoning", "reasoning_content":
			if f.Type != gjson.String {
				return true
			}
			if k.Str == "reasoning" {
				a.reasoning = true
			} else {
				a.reasoningContent = true
			}
			// 0.11 to 0.1x send the same text under both names: take one.
			if k.Str == "reasoning" || !d.Get("reasoning").Exists() {
				c.hasReasoning = true
				appendRawString(&c.reasoning, f)
			}
		case "refusal":
			if f.Type == gjson.String {
				c.hasRefusal = true
				appendRawString(&c.refusal, f)
			}
		case "tool_calls":
			f.ForEach(func(_, tc gjson.Result) bool {
				i := tc.Get("index").Int()
				if i < 0 || i > 1024 {
					return true
				}
				for int64(len(c.toolCalls)) <= i {
					c.toolCalls = append(c.toolCalls, nil)
				}
				t := c.toolCalls[i]
				if t == nil {
					t = &asmToolCall{}
					c.toolCalls[i] = t
				}
				if id := tc.Get("id"); id.Type == gjson.String && t.id == "" {
					t.id = keep(id.Raw)
				}
				if typ := tc.Get("type"); typ.Type == gjson.String && t.typ == "" {
					t.typ = keep(typ.Raw)
				}
				appendRawString(&t.name, tc.Get("function.name"))
				appendRawString(&t.arguments, tc.Get("function.arguments"))
				return true
			})
		}
		return true
	})
}

// keep copies a piece of a payload that the answer keeps: payloads are
// parsed in place and their buffers reused.
func keep(raw string) string { return strings.Clone(raw) }

// appendRawString appends a JSON string's escaped bytes, without its
// quotes; anything but a string adds nothing.
func appendRawString(dst *[]byte, v gjson.Result) {
	if v.Type != gjson.String || len(v.Raw) < 2 {
		return
	}
	*dst = append(*dst, v.Raw[1:len(v.Raw)-1]...)
}

func listFor(ls *[]asmList, key string) *asmList {
	for i := range *ls {
		if (*ls)[i].key == key {
			return &(*ls)[i]
		}
	}
	*ls = append(*ls, asmList{key: keep(key)})
	return &(*ls)[len(*ls)-1]
}

// body renders the answer; fallback is the usage the gateway counted, for a
// stream that ended without its usage chunk.
func (a *assembler) body(fallback policy.Usage) []byte {
	b := make([]byte, 0, 512+a.size())
	b = append(b, `{"id":`...)
	b = appendRawOr(b, a.id, `""`)
	if a.chat {
		b = append(b, `,"object":"chat.completion","created":`...)
	} else {
		b = append(b, `,"object":"text_completion","created":`...)
	}
	b = appendRawOr(b, a.created, "0")
	b = append(b, `,"model":`...)
	b = appendRawOr(b, a.model, `""`)
	b = append(b, `,"choices":[`...)
	first := true
	for i, c := range a.choices {
		if !c.seen {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		if a.chat {
			b = a.appendChatChoice(b, i, c)
		} else {
			b = appendCompletionChoice(b, i, c)
		}
	}
	b = append(b, `],"service_tier":null,"system_fingerprint":`...)
	b = appendRawOr(b, a.fingerprint, "null")
	b = append(b, `,"usage":`...)
	b = a.appendUsage(b, fallback)
	if a.chat {
		b = append(b, `,"prompt_logprobs":null,"prompt_token_ids":`...)
		b = appendRawOr(b, a.promptTokenIDs, "null")
		b = append(b, `,"prompt_text":`...)
		b = appendRawOr(b, a.promptText, "null")
	}
	b = append(b, `,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":`...)
	b = appendRawOr(b, a.metrics, "null")
	return append(b, '}')
}

// size is about the bytes the choices' text will take.
func (a *assembler) size() int {
	n := 0
	for _, c := range a.choices {
		n += 256 + len(c.content) + len(c.reasoning) + len(c.tokenIDs.elems)
		for _, l := range c.logprobs {
			n += len(l.elems) + 8
		}
		for _, t := range c.toolCalls {
			if t != nil {
				n += 96 + len(t.arguments)
			}
		}
	}
	return n
}

func (a *assembler) appendChatChoice(b []byte, i int, c *asmChoice) []byte {
	b = append(b, `{"index":`...)
	b = strconv.AppendInt(b, int64(i), 10)
	b = append(b, `,"message":{"role":`...)
	b = appendRawOr(b, c.role, `"assistant"`)
	b = append(b, `,"content":`...)
	calls := len(c.toolCalls) > 0
	switch {
	case calls && a.forcedTool:
		b = append(b, `""`...)
	case len(c.content) == 0 && (calls || c.hasReasoning):
		b = append(b, "null"...)
	default:
		b = appendQuotedRaw(b, c.content)
	}
	b = append(b, `,"refusal":`...)
	if c.hasRefusal {
		b = appendQuotedRaw(b, c.refusal)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"annotations":null,"audio":null,"function_call":null`...)
	if calls {
		b = append(b, `,"tool_calls":[`...)
		first := true
		for _, t := range c.toolCalls {
			if t == nil {
				continue
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = append(b, `{"id":`...)
			b = appendRawOr(b, t.id, `""`)
			b = append(b, `,"type":`...)
			b = appendRawOr(b, t.typ, `"function"`)
			b = append(b, `,"function":{"name":`...)
			b = appendQuotedRaw(b, t.name)
			b = append(b, `,"arguments":`...)
			b = appendQuotedRaw(b, t.arguments)
			b = append(b, "}}"...)
		}
		b = append(b, ']')
	}
	reasoning := func(b []byte) []byte {
		if !c.hasReasoning {
			return append(b, "null"...)
		}
		return appendQuotedRaw(b, c.reasoning)
	}
	// The names the engine used; current vLLM's when it sent no reasoning.
	if a.reasoning || !a.reasoningContent {
		b = append(b, `,"reasoning":`...)
		b = reasoning(b)
	}
	if a.reasoningContent {
		b = append(b, `,"reasoning_content":`...)
		b = reasoning(b)
	}
	b = append(b, `},"logprobs":`...)
	b = appendLogprobs(b, c)
	b = append(b, `,"finish_reason":`...)
	b = appendRawOr(b, c.finish, "null")
	b = append(b, `,"stop_reason":`...)
	b = appendRawOr(b, c.stop, "null")
	b = append(b, `,"token_ids":`...)
	b = appendTokenIDs(b, c)
	return append(b, `,"routed_experts":null}`...)
}

func appendCompletionChoice(b []byte, i int, c *asmChoice) []byte {
	b = append(b, `{"index":`...)
	b = strconv.AppendInt(b, int64(i), 10)
	b = append(b, `,"text":`...)
	b = appendQuotedRaw(b, c.content)
	b = append(b, `,"logprobs":`...)
	b = appendLogprobs(b, c)
	b = append(b, `,"finish_reason":`...)
	b = appendRawOr(b, c.finish, "null")
	b = append(b, `,"stop_reason":`...)
	b = appendRawOr(b, c.stop, "null")
	b = append(b, `,"token_ids":`...)
	b = appendTokenIDs(b, c)
	b = append(b, `,"prompt_logprobs":null,"prompt_token_ids":`...)
	b = appendRawOr(b, c.promptIDs, "null")
	return append(b, `,"routed_experts":null}`...)
}

func appendLogprobs(b []byte, c *asmChoice) []byte {
	if !c.hasLogprobs {
		return append(b, "null"...)
	}
	b = append(b, '{')
	for i, l := range c.logprobs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, l.key) // keys are plain ASCII names
		b = append(b, ":["...)
		b = append(b, l.elems...)
		b = append(b, ']')
	}
	return append(b, '}')
}

func appendTokenIDs(b []byte, c *asmChoice) []byte {
	if !c.hasTokenIDs {
		return append(b, "null"...)
	}
	b = append(b, '[')
	b = append(b, c.tokenIDs.elems...)
	return append(b, ']')
}

// appendUsage renders UsageInfo as model_dump() writes it: the three
// counts, then both details, null when the engine sent none.
func (a *assembler) appendUsage(b []byte, fallback policy.Usage) []byte {
	prompt, completion := fallback.PromptTokens, fallback.CompletionTokens
	total := prompt + completion
	var promptDetails, completionDetails string
	if a.usage != "" {
		u := gjson.Parse(a.usage)
		prompt, completion = u.Get("prompt_tokens").Int(), u.Get("completion_tokens").Int()
		total = prompt + completion
		if t := u.Get("total_tokens"); t.Type == gjson.Number {
			total = t.Int()
		}
		if d := u.Get("prompt_tokens_details"); d.Type != gjson.Null {
			promptDetails = d.Raw
		}
		if d := u.Get("completion_tokens_details"); d.Type != gjson.Null {
			completionDetails = d.Raw
		}
	}
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, prompt, 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, total, 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, completion, 10)
	b = append(b, `,"prompt_tokens_details":`...)
	b = appendRawOr(b, promptDetails, "null")
	b = append(b, `,"completion_tokens_details":`...)
	b = appendRawOr(b, completionDetails, "null")
	return append(b, '}')
}

func appendRawOr(b []byte, raw, def string) []byte {
	if raw == "" {
		return append(b, def...)
	}
	return append(b, raw...)
}

func appendQuotedRaw(b, escaped []byte) []byte {
	b = append(b, '"')
	b = append(b, escaped...)
	return append(b, '"')
}

// Answers the client sees only whole. A JSON answer is assembled from the
// engine's stream and nothing of it reaches the client before it is whole,
// so the router's call (router.Call.Whole) may race a pace hedge against an
// attempt that falls behind its model's decode pace and start one that
// broke once more elsewhere. The server only reads: assembleAttempt reads
// one attempt's answer and tells the router its progress and how it ended.

// assembleAttempt reads u's answer whole (see assembleJSON) into u.body,
// telling progress of each token after the first, and returns how it
// ended, as the router classifies it (see routerEnd).
func (s *Server) assembleAttempt(ctx context.Context, cl *call, u *upstream, progress func(int64, time.Time)) error {
	body, err := s.assembleJSON(ctx, cl, u, progress)
	u.body = body
	return routerEnd(err)
}

// routerEnd tells the router how an answer that had its first token ended:
// one that broke or went quiet is a router.ErrBroke (an idle one's replica
// is ejected; see router.Call.End and Call.Whole); any other failure — an
// error event, a deadline, the client going away — is the answer's own.
func routerEnd(err error) error {
	var me *midstreamError
	if errors.As(err, &me) {
		switch me.class {
		case data.ClassMidstream:
			return router.ErrBroke(err, false)
		case data.ClassIdleDeadline:
			return router.ErrBroke(err, true)
		}
	}
	return err
}

// assembleJSON reads the winning attempt's stream to its end — the events
// it buffered up to its first token, then the rest (read by
// [upstream.next]) — and returns the JSON answer. Nothing reaches the client
// meanwhile: a failure here is still a plain HTTP error for it. The
// inter-token idle deadline and the whole-answer deadline
// (Config.JSONDeadline, from the attempt's start) both apply. A non-nil
// progress is told of every token after the first, which holds the attempt
// to its model's decode pace (see assembleAttempt).
func (s *Server) assembleJSON(ctx context.Context, cl *call, u *upstream, progress func(int64, time.Time)) ([]byte, error) {
	a := newAssembler(cl.ep, cl.req.forcedTool)
	for _, ev := range u.pending {
		a.add(sse.Data(ev)) // no error event is ever pending
	}
	u.pending = nil
	if u.done {
		a.traced(cl, u)
		return a.body(u.usage), nil
	}
	u.follow(ctx, s.idleDeadline(cl.req.model), u.sentAt.Add(s.cfg.JSONDeadline))
	defer u.unfollow()
	for {
		kind, ev, err := u.next(cl)
		if err != nil {
			return nil, err
		}
		switch kind {
		case evDone:
			if us, ok := a.totals(); ok {
				u.usage, u.gotUsage = us, true
			}
			a.traced(cl, u)
			return a.body(u.usage), nil
		case evError:
			return nil, u.errorEventEnd()
		case evToken, evOther:
			// The assembler's parse of the chunk is the only one: the
			// running usage is kept, for an attempt that loses its race or
			// breaks.
			cu := a.add(sse.Data(ev))
			u.takeUsage(cl, cu.usage, cu.usageOnly, cu.index)
			if progress != nil {
				progress(u.tokens-1, u.lastAt)
			}
		}
	}
}

// totals returns the usage of the stream's usage chunk, if it came.
func (a *assembler) totals() (policy.Usage, bool) {
	if a.usage == "" {
		return policy.Usage{}, false
	}
	u := gjson.Parse(a.usage)
	return policy.Usage{PromptTokens: u.Get("prompt_tokens").Int(), CompletionTokens: u.Get("completion_tokens").Int()}, true
}
