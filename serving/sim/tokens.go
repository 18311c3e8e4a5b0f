package sim

// The simulator's tokenizer is a formula, not a vocabulary: counts depend only
// on byte lengths, and they never exceed the prompt's bytes plus 8 per message
// plus 16, the bound the gateway reserves budget with.

// ChatPromptTokens returns the prompt tokens of a chat request whose messages
// have the given text contents (a message made of text parts counts as the
// concatenation of its parts): 3 + Σ (4 + ⌈len(content)/4⌉), lengths in bytes.
func ChatPromptTokens(contents ...string) int {
	n := 3
	for _, c := range contents {
		n += messageTokens(len(c))
	}
	return n
}

// TextPromptTokens returns the prompt tokens of a completions request with
// the given prompt: 1 + ⌈len(prompt)/4⌉, length in bytes.
func TextPromptTokens(prompt string) int {
	return 1 + ceilQuarter(len(prompt))
}

// CompletionTokens returns how many tokens the simulator generates for a
// prompt whose text is the concatenation of contents (all message contents in
// order for chat, the prompt for completions). limit is the completion cap in
// force (max_completion_tokens, else max_tokens, else the engine's default)
// and minTokens is the request's min_tokens. With ignoreEOS the answer is
// exactly limit; otherwise it is min(limit, 16 + fnv32a(text) % 113), raised
// to minTokens + 1 when min_tokens is set (min_tokens tokens, then the
// end-of-sequence token, which vLLM holds back until then). An answer
// shorter than limit ends with that EOS token: it counts here but carries no
// text, so the answer has one word fewer (see [Config.NoEOSToken], under
// which min_tokens raises it to minTokens exactly).
func CompletionTokens(limit, minTokens int, ignoreEOS bool, contents ...string) int {
	h := uint32(fnvOffset)
	for _, c := range contents {
		h = fnvString(h, c)
	}
	return completionTokens(h, limit, minTokens, ignoreEOS, true)
}

// completionTokens is CompletionTokens for a prompt hashing to h; eos says
// whether the answer ends with an EOS token.
func completionTokens(h uint32, limit, minTokens int, ignoreEOS, eos bool) int {
	if ignoreEOS {
		return limit
	}
	if eos && minTokens > 0 {
		minTokens++
	}
	n := min(limit, 16+int(h%113))
	return min(max(n, minTokens), limit)
}

func messageTokens(contentBytes int) int { return 4 + ceilQuarter(contentBytes) }

func ceilQuarter(n int) int { return (n + 3) / 4 }

const (
	fnvOffset = 2166136261
	fnvPrime  = 16777619
)

// fnvString folds s into the FNV-1a hash h; the zero-allocation version of
// hash/fnv's New32a.
func fnvString(h uint32, s string) uint32 {
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= fnvPrime
	}
	return h
}

// words is the simulator's whole vocabulary; each token is one word and its
// trailing space. Plain ASCII, so it never needs JSON escaping.
var words = [16]string{
	"lorem ", "ipsum ", "dolor ", "sit ", "amet ", "consectetur ", "adipiscing ", "elit ",
	"sed ", "do ", "eiusmod ", "tempor ", "incididunt ", "ut ", "labore ", "magna ",
}

// word returns the i-th token of the answer to a prompt hashing to h.
func word(h uint32, i int) string {
	x := h + uint32(i)*0x9e3779b1
	x ^= x >> 15
	x *= 0x2c1b3c6d
	x ^= x >> 12
	return words[x&15]
}
