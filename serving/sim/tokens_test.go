package sim

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func TestPromptTokensStayUnderTheGatewayBound(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		msgs := make([]string, r.IntN(6))
		bytes := 0
		for i := range msgs {
			msgs[i] = strings.Repeat("é", r.IntN(40)) + strings.Repeat("a", r.IntN(40))
			bytes += len(msgs[i])
		}
		if got, bound := ChatPromptTokens(msgs...), bytes+8*len(msgs)+16; got > bound {
			t.Fatalf("chat %q: %d tokens exceed the bound %d", msgs, got, bound)
		}
		prompt := strings.Join(msgs, "")
		if got, bound := TextPromptTokens(prompt), len(prompt)+8+16; got > bound {
			t.Fatalf("prompt %q: %d tokens exceed the bound %d", prompt, got, bound)
		}
	}
}

func TestTokenFormulas(t *testing.T) {
	if got := ChatPromptTokens("hello", "", "abcdefghi"); got != 3+(4+2)+(4+0)+(4+3) {
		t.Errorf("ChatPromptTokens = %d", got)
	}
	if got := TextPromptTokens("abcde"); got != 1+2 {
		t.Errorf("TextPromptTokens = %d", got)
	}
	nat := naturalLength("systemuser")
	tests := []struct {
		name             string
		limit, minTokens int
		ignoreEOS        bool
		want             int
	}{
		{"natural length under the cap", 1000, 0, false, nat},
		{"cap below natural length", 5, 0, false, 5},
		{"ignore_eos takes the cap", 1000, 0, true, 1000},
		{"min_tokens raises, then the EOS", 1000, 500, false, 501},
		{"min_tokens at the cap", 500, 500, false, 500},
		{"min_tokens below natural", 1000, 1, false, nat},
	}
	for _, tt := range tests {
		if got := CompletionTokens(tt.limit, tt.minTokens, tt.ignoreEOS, "system", "user"); got != tt.want {
			t.Errorf("%s: CompletionTokens = %d, want %d", tt.name, got, tt.want)
		}
	}
}
