package server

import (
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/tidwall/gjson"
)

// requestBodies are request bodies as clients send them: the bench's short
// chat, a conversation of many turns, a completion with the fields last.
func requestBodies() map[string]string {
	var turns []string
	for i := range 40 {
		turns = append(turns, fmt.Sprintf(`{"role":"user","content":%q},{"role":"assistant","content":[{"type":"text","text":"turn %d"}]}`,
			strings.Repeat("a long question about the weather ", 8), i))
	}
	return map[string]string{
		"short chat": `{"model":"tailgate-sim","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello to the benchmark."}],"max_tokens":16,"ignore_eos":true}`,
		"40 turns":   `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[` + strings.Join(turns, ",") + `],"user":"u-1","prompt_cache_key":"k","priority":"batch","max_completion_tokens":64,"tool_choice":{"type":"function"}}`,
		"completion": ` { "prompt" : ["a", "b"] , "n" : 2, "best_of": null, "use_beam_search": false, "prompt_logprobs": 3, "mod\u0065l": "m\u00e9", "max_tokens": 7 } `,
		"no fields":  `{"other":{"model":"not this one"},"x":[1,2,{"stream":true}]}`,
	}
}

func TestReadFieldsFindsWhatGetManyFound(t *testing.T) {
	for name, body := range requestBodies() {
		t.Run(name, func(t *testing.T) {
			got := readFields(body)
			want := gjson.GetMany(body, requestFields[:]...)
			for i, n := range requestFields {
				g, w := got[i], want[i]
				if g.Type != w.Type || g.Raw != w.Raw || g.Str != w.Str || g.Num != w.Num || g.Exists() != w.Exists() {
					t.Errorf("%s: got %v %q, GetMany %v %q", n, g.Type, g.Raw, w.Type, w.Raw)
				}
			}
		})
	}
}

// BenchmarkReadFields: the one walk against gjson.GetMany's walk per name.
func BenchmarkReadFields(b *testing.B) {
	for _, name := range []string{"short chat", "40 turns"} {
		body := requestBodies()[name]
		s := unsafe.String(unsafe.StringData(body), len(body))
		b.Run(name+"/readFields", func(b *testing.B) {
			for b.Loop() {
				_ = readFields(s)
			}
		})
		b.Run(name+"/GetMany", func(b *testing.B) {
			for b.Loop() {
				_ = gjson.GetMany(s, requestFields[:]...)
			}
		})
	}
}

// BenchmarkParseRequest: all parseRequest does with a chat request, short
// and of 40 turns.
func BenchmarkParseRequest(b *testing.B) {
	lim := parseLimits{maxDepth: 64, mediaPart: DefaultMediaPartTokens, defaultMax: func(string) int64 { return 1024 }}
	for _, name := range []string{"short chat", "40 turns"} {
		body := []byte(requestBodies()[name])
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := parseRequest(chatEndpoint, body, "", lim); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
