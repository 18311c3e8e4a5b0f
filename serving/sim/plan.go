package sim

// A choice's output is decided before its first token, from the prompt's
// hash alone, and then produced one token per TPOT: first the reasoning
// phase (Config.ReasoningTokens, on the endpoints that show one), then
// either text or one tool call. A text answer that finishes with "stop"
// ends, as a model's does, with its end-of-sequence token: it decodes to
// nothing but counts as a completion token (unless Config.NoEOSToken). A
// stream sends one token per delta unless a stream interval merges them
// (see chunkEnd).

// tokKind is what one generated token carries.
type tokKind uint8

const (
	kReasoning tokKind = iota // a reasoning word
	kContent                  // a content word
	kToolName                 // the tool call's opening delta: id, type, name
	kToolArgs                 // a piece of the tool call's arguments
	kEOS                      // an end-of-sequence token: after a complete tool call, or ending a "stop" text
)

// choice is one of a request's n answers.
type choice struct {
	index     int
	hash      uint32
	reasoning int      // reasoning tokens
	content   int      // content tokens
	out       []string // structured text, one token each (see structured.go)
	call      *toolCall
	callToks  int    // tokens of the call: name, argument pieces, EOS when complete
	eos       bool   // the last content token is the end-of-sequence token
	finish    string // "stop", "length" or "tool_calls"
	sent      int    // tokens already streamed (see chunkEnd)
}

// plan decides every choice of j. Reasoning and tool calls share the
// completion cap with the text: a cap spent on reasoning ends with
// "length" and no answer.
func (e *Engine) plan(j *job) []*choice {
	out := make([]*choice, j.n)
	for i := range out {
		h := j.hash
		if i > 0 {
			h = mix(h, uint32(i))
		}
		c := &choice{index: i, hash: h}
		budget := j.limit
		if j.reasons {
			c.reasoning = min(e.cfg.ReasoningTokens, budget)
			budget -= c.reasoning
		}
		if j.fixed > 0 { // a transcript: its length is the audio's
			c.content = min(j.fixed, budget)
			c.finish = "stop"
			if c.content < j.fixed {
				c.finish = "length"
			}
			out[i] = c
			continue
		}
		if t := j.pickTool(h); t != nil && budget > 0 {
			c.call = newToolCall(t, h)
			need := 1 + len(c.call.pieces) + 1
			c.callToks = min(need, budget)
			switch {
			case c.callToks < need:
				c.finish = "length"
			case j.toolMode == toolNamed:
				c.finish = "stop" // vLLM: "stop" for named calls
			default:
				c.finish = "tool_calls"
			}
		} else if j.format != nil {
			e.planStructured(j, c, budget)
		} else {
			c.content = completionTokens(h, budget, max(0, j.minTokens-c.reasoning), j.ignoreEOS, !e.cfg.NoEOSToken)
			c.finish = "stop"
			if c.reasoning+c.content >= j.limit {
				c.finish = "length"
			}
			c.eos = c.finish == "stop" && c.content > 1 && !e.cfg.NoEOSToken
		}
		out[i] = c
	}
	return out
}

// total is the number of tokens the choice generates.
func (c *choice) total() int { return c.reasoning + c.content + c.callToks }

// kind returns what token k carries.
func (c *choice) kind(k int) tokKind {
	switch {
	case k < c.reasoning:
		return kReasoning
	case c.call == nil && c.eos && k == c.total()-1:
		return kEOS
	case c.call == nil:
		return kContent
	case k == c.reasoning:
		return kToolName
	case k-c.reasoning-1 < len(c.call.pieces):
		return kToolArgs
	}
	return kEOS
}

// text returns the text token k adds: a word, or an argument piece.
func (c *choice) text(k int) string {
	switch c.kind(k) {
	case kReasoning:
		return word(c.hash^reasoningSalt, k)
	case kContent:
		if c.out != nil {
			return c.structuredToken(k - c.reasoning)
		}
		return word(c.hash, k-c.reasoning)
	case kToolArgs:
		return c.call.pieces[k-c.reasoning-1]
	}
	return ""
}

// chunkEnd reports whether token k ends a stream chunk when interval
// tokens may share one, as vLLM's output processor sends them
// (vllm/v1/engine/output_processor.py, RequestState.make_request_output):
// the first token at once, then every interval tokens, and the last. The
// simulator also ends a chunk where the kind of output changes (reasoning,
// text, a tool call's name, its arguments), so one delta never mixes them.
func (c *choice) chunkEnd(k, interval int) bool {
	switch {
	case interval <= 1, k == 0, k == c.total()-1, k+1-c.sent >= interval:
		return true
	}
	return c.group(k) != c.group(k+1)
}

// group is what token k's delta holds: its kind, with a text's EOS counted
// as text (it decodes to nothing and rides on the text's last chunk).
func (c *choice) group(k int) tokKind {
	if g := c.kind(k); g != kEOS || c.call != nil {
		return g
	}
	return kContent
}

// reasoningText returns the whole reasoning of the choice.
func (c *choice) reasoningText() string { return c.joined(0, c.reasoning) }

// contentText returns the whole text answer of the choice.
func (c *choice) contentText() string {
	if c.call != nil {
		return ""
	}
	return c.joined(c.reasoning, c.total())
}

// args returns the arguments the choice sent, cut short when the cap ended
// the call.
func (c *choice) args() string {
	if c.call == nil {
		return ""
	}
	return c.joined(c.reasoning+1, c.total())
}

func (c *choice) joined(from, to int) string {
	var b []byte
	for k := from; k < to; k++ {
		b = append(b, c.text(k)...)
	}
	return string(b)
}

// reasoningBy returns the reasoning tokens among the first k tokens.
func (c *choice) reasoningBy(k int) int { return min(k, c.reasoning) }

// reasoningSalt makes reasoning words differ from the answer's.
const reasoningSalt = 0x5bd1e995

// mix derives choice i's hash from the prompt's: choices differ as sampled
// answers do, and choice 0 keeps the documented formula.
func mix(h, i uint32) uint32 {
	x := h ^ (i * 0x9e3779b1)
	x ^= x >> 16
	x *= 0x85ebca6b
	x ^= x >> 13
	x *= 0xc2b2ae35
	x ^= x >> 16
	return x
}
