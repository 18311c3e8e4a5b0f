package server

import (
	"testing"

	"github.com/tidwall/gjson"
)

// usageTokensByGet is usageTokens as it read a usage object before, a Get
// for each member: what the one walk must read.
func usageTokensByGet(u gjson.Result) (in, out int64) {
	in = max(u.Get("prompt_tokens").Int(), u.Get("input_tokens").Int())
	out = max(u.Get("completion_tokens").Int(), u.Get("output_tokens").Int())
	if in == 0 && out == 0 {
		in = u.Get("total_tokens").Int()
	}
	if u.Get("type").Str == "duration" {
		in = audioTokensPerSecond * u.Get("seconds").Int()
	}
	return in, out
}

// otherUsageObjects are the usage objects of endpoints beside chat (whose
// shapes are usageObjects): Responses, Messages, rerank, transcription.
var otherUsageObjects = []string{
	`{"input_tokens":11,"input_tokens_details":{"cached_tokens":0},"output_tokens":7,"total_tokens":18}`,
	`{"input_tokens":5,"output_tokens":1}`,
	`{"total_tokens":33}`,
	`{"type":"duration","seconds":7}`,
	`{"prompt_tokens":3,"prompt_tokens":9,"completion_tokens":2.5,"output_tokens":"4"}`,
	`{}`,
}

func TestUsageTokensReadsWhatGetRead(t *testing.T) {
	for _, obj := range append(usageObjects[:len(usageObjects):len(usageObjects)], otherUsageObjects...) {
		u := gjson.Parse(obj)
		in, out := usageTokens(u)
		win, wout := usageTokensByGet(u)
		if in != win || out != wout {
			t.Errorf("%s: %d in, %d out; by Get %d, %d", obj, in, out, win, wout)
		}
	}
}

// BenchmarkUsageTokens: a chat answer's usage by one walk and by a Get for
// each member (the baseline it replaced).
func BenchmarkUsageTokens(b *testing.B) {
	u := gjson.Parse(usageObjects[2])
	b.Run("walk", func(b *testing.B) {
		for b.Loop() {
			_, _ = usageTokens(u)
		}
	})
	b.Run("Get", func(b *testing.B) {
		for b.Loop() {
			_, _ = usageTokensByGet(u)
		}
	})
}
