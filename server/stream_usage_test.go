package server

import (
	"testing"

	"github.com/tidwall/gjson"
)

// usageObjects are usage objects as engines send them (the first eight,
// which the fast reader must read), then shapes it must decline and leave
// to gjson rather than misread.
var usageObjects = []string{
	`{"prompt_tokens":8,"total_tokens":9,"completion_tokens":1}`,
	`{"prompt_tokens":1234,"total_tokens":1300,"completion_tokens":66,"prompt_tokens_details":null}`,
	`{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":8},"completion_tokens_details":{"reasoning_tokens":2}}`,
	`{ "prompt_tokens" : 8 , "completion_tokens" : 1 }`,
	"{\n\t\"prompt_tokens\": 8,\n\t\"completion_tokens\": 1\n}",
	`{"completion_tokens":5}`,
	`{"note":"a \"prompt_tokens\":99 in a string","prompt_tokens":7,"completion_tokens":2}`,
	`{"extra":[1,{"prompt_tokens":99}],"prompt_tokens":7,"completion_tokens":2,"flag":true}`,

	`{"prompt_tokens":7.0,"completion_tokens":2}`,
	`{"prompt_tokens":-1,"completion_tokens":2}`,
	`{"prompt_tokens":1e3,"completion_tokens":2}`,
	`{"prompt_\u0074okens":5,"completion_tokens":2}`,
	`{"prompt_tokens":"8","completion_tokens":2}`,
	`{"prompt_tokens":8,"completion_tokens":2`,
	`{"prompt_tokens":8,,"completion_tokens":2}`,
	`{"prompt_tokens":8,"prompt_tokens":9}`,
	`{"prompt_tokens":1234567890123456789,"completion_tokens":2}`,
	`{"prompt_tokens":8} trailing`,
	`[1,2]`,
}

// TestUsageCountsReadsWhatGJSONRead: on every usage shape an engine sends,
// the fast reader bills what gjson's lookups billed; every other shape it
// declines, so gjson reads it as before.
func TestUsageCountsReadsWhatGJSONRead(t *testing.T) {
	for i, obj := range usageObjects {
		p, c, ok := usageCounts(obj)
		if want := i < 8; ok != want {
			t.Errorf("%s: read %v, want %v", obj, ok, want)
			continue
		}
		if !ok {
			continue
		}
		v := gjson.Parse(obj)
		if wp, wc := v.Get("prompt_tokens").Int(), v.Get("completion_tokens").Int(); p != wp || c != wc {
			t.Errorf("%s: read %d/%d, gjson %d/%d", obj, p, c, wp, wc)
		}
	}
}

// BenchmarkUsageCounts: a vLLM chunk's continuous usage, read by the fast
// reader and by the two gjson lookups it replaced (64 and 176 ns, 98 and
// 310 ns, on a shared 2-core machine at two hours).
func BenchmarkUsageCounts(b *testing.B) {
	obj := usageObjects[1]
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, c, ok := usageCounts(obj); !ok || c != 66 {
				b.Fatal("misread")
			}
		}
	})
	b.Run("gjson", func(b *testing.B) {
		b.ReportAllocs()
		v := gjson.Result{Type: gjson.JSON, Raw: obj}
		for b.Loop() {
			if v.Get("prompt_tokens").Int() != 1234 || v.Get("completion_tokens").Int() != 66 {
				b.Fatal("misread")
			}
		}
	})
}
