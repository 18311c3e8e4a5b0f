package server

import (
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
)

// TestRequestAttributesRecordOnlyKnownParameters: a span records the
// request's temperature and top_p only as numbers vLLM would accept, and
// max_tokens only when a cap is in force; a string, an out-of-range number
// or a huge one records nothing (a span holds nothing a client chose
// freely).
func TestRequestAttributesRecordOnlyKnownParameters(t *testing.T) {
	for _, tc := range []struct {
		body      string
		maxTokens int64
		want      map[string]string // attribute → value; absent ones must be absent
	}{
		{`{"temperature":0.7,"top_p":0.95}`, 16, map[string]string{"gen_ai.request.temperature": "0.7", "gen_ai.request.top_p": "0.95", "gen_ai.request.max_tokens": "16"}},
		{`{"temperature":0,"top_p":1}`, 0, map[string]string{"gen_ai.request.temperature": "0", "gen_ai.request.top_p": "1"}},
		{`{"temperature":"0.7","top_p":"` + strings.Repeat("9", 4096) + `"}`, 0, map[string]string{}},
		{`{"temperature":-1,"top_p":0}`, 0, map[string]string{}},
		{`{"temperature":1e999,"top_p":1.5}`, 0, map[string]string{}},
		{`{"messages":[{"temperature":0.3}]}`, 0, map[string]string{}},
	} {
		pr := &parsedRequest{body: []byte(tc.body), maxTokens: tc.maxTokens}
		got := map[string]string{}
		for _, kv := range requestAttributes("m", pr) {
			got[string(kv.Key)] = kv.Value.Emit()
		}
		for _, key := range []attribute.Key{"gen_ai.request.temperature", "gen_ai.request.top_p", "gen_ai.request.max_tokens"} {
			want, ok := tc.want[string(key)]
			if g, has := got[string(key)]; has != ok || g != want {
				t.Errorf("%s (max_tokens %d): %s = %q (set %v), want %q (set %v)", tc.body, tc.maxTokens, key, g, has, want, ok)
			}
		}
		if got["gen_ai.request.model"] != "m" {
			t.Errorf("%s: gen_ai.request.model %q, want m", tc.body, got["gen_ai.request.model"])
		}
	}
}
