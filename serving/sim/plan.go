package sim

// A choice's output is decided before its first token, from the prompt's
// hash alone, and then produced one token per TPOT: first the reasoning
// phase (Config.ReasoningTokens, on the endpoints that show one), then
// either text or one tool call. Every token is one delta on the wire, so
// token and event counts agree.

// tokKind is what one generated token carries.
type tokKind uint8

const (
	kReasoning tokKind = iota // a reasoning word
	kContent                  // a content word
	kToolName                 // the tool call's opening delta: id, type, name
	kToolArgs                 // a piece of the tool call's arguments
	kEOS                      // the end of a complete tool call: an empty delta
)

// choice is one of a request's n answers.
type choice struct {
	index     int
	hash      uint32
	reasoning int // reasoning tokens
	content   int // content tokens
	call      *toolCall
	callToks  int    // tokens of the call: name, argument pieces, EOS when complete
	finish    string // "stop", "length" or "tool_calls"
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
		} else {
			c.content = completionTokens(h, budget, max(0, j.minTokens-c.reasoning), j.ignoreEOS)
			c.finish = "stop"
			if c.reasoning+c.content >= j.limit {
				c.finish = "length"
			}
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
		return word(c.hash, k-c.reasoning)
	case kToolArgs:
		return c.call.pieces[k-c.reasoning-1]
	}
	return ""
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
