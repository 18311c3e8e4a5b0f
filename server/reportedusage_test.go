package server

import (
	"testing"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tidwall/gjson"
)

// reportedUsageByGet is reportedUsage as it read a usage object before, a
// Get for each member: what the one walk must read.
func reportedUsageByGet(payload []byte, prev policy.Usage) (policy.Usage, bool) {
	v := gjson.ParseBytes(payload)
	u := v.Get("usage")
	if !u.IsObject() {
		u = v.Get("response.usage")
	}
	if !u.IsObject() {
		u = v.Get("message.usage")
	}
	if !u.IsObject() {
		return prev, false
	}
	in := max(u.Get("prompt_tokens").Int(), u.Get("input_tokens").Int())
	out := max(u.Get("completion_tokens").Int(), u.Get("output_tokens").Int())
	if in == 0 && out == 0 {
		in = u.Get("total_tokens").Int()
	}
	if u.Get("type").Str == "duration" {
		in = audioTokensPerSecond * u.Get("seconds").Int()
	}
	return policy.Usage{PromptTokens: max(prev.PromptTokens, in), CompletionTokens: max(prev.CompletionTokens, out)}, true
}

// usagePayloads are answers and events as engines write them, and some
// they should not.
var usagePayloads = []string{
	`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"length"}],"usage":{"prompt_tokens":24,"total_tokens":40,"completion_tokens":16,"prompt_tokens_details":null}}`,
	`{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":11,"input_tokens_details":{"cached_tokens":0},"output_tokens":7,"total_tokens":18}}}`,
	`{"type":"message_start","message":{"usage":{"input_tokens":5,"output_tokens":1}}}`,
	`{"results":[],"usage":{"total_tokens":33}}`,
	`{"text":"hello","usage":{"type":"duration","seconds":7}}`,
	`{"usage":{"prompt_tokens":3,"prompt_tokens":9,"completion_tokens":2.5,"output_tokens":"4"}}`,
	`{"usage":{"prompt\u005ftokens":12,"completion_tokens":-1}}`,
	`{"usage":{}}`,
	`{"usage":null,"response":{"usage":{"output_tokens":2}}}`,
	`{"choices":[]}`,
	`{"usage":{"prompt_tokens":1,`,
	`not json`,
}

func TestReportedUsageReadsWhatGetRead(t *testing.T) {
	prev := policy.Usage{PromptTokens: 4, CompletionTokens: 3}
	for _, p := range usagePayloads {
		for _, pr := range []policy.Usage{{}, prev} {
			got, ok := reportedUsage([]byte(p), pr)
			want, wok := reportedUsageByGet([]byte(p), pr)
			if got != want || ok != wok {
				t.Errorf("%s after %+v: %+v %v, by Get %+v %v", p, pr, got, ok, want, wok)
			}
		}
	}
}

// BenchmarkReportedUsage: a chat answer's usage by one walk and by a Get
// for each member (the baseline it replaced).
func BenchmarkReportedUsage(b *testing.B) {
	p := []byte(usagePayloads[0])
	b.Run("walk", func(b *testing.B) {
		for b.Loop() {
			_, _ = reportedUsage(p, policy.Usage{})
		}
	})
	b.Run("Get", func(b *testing.B) {
		for b.Loop() {
			_, _ = reportedUsageByGet(p, policy.Usage{})
		}
	})
}
