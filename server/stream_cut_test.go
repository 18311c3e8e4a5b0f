package server

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tailgate-dev/tailgate/serving/sse"
)

// TestCutUsageMatchesDeletingTheMember: the in-place cut of a chunk's
// usage gives the client the same JSON as deleting the member with sjson
// did, for every place vLLM (or another engine) may put it, and declines
// (leaving the event as it was) where it cannot cut.
func TestCutUsageMatchesDeletingTheMember(t *testing.T) {
	for _, tc := range []struct {
		name, ev string
		cut      bool
	}{
		{"vllm, last member", `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}],"usage":{"prompt_tokens":8,"total_tokens":9,"completion_tokens":1}}` + "\n\n", true},
		{"first member", `data: {"usage":{"prompt_tokens":8,"completion_tokens":1},"id":"c1","choices":[{"index":0,"delta":{"content":"hi"}}]}` + "\n\n", true},
		{"middle, spaces", `data: {"id":"c1" , "usage" : {"prompt_tokens":8, "completion_tokens":1} , "choices":[{"index":0,"delta":{"content":"\"usage\":{"}}]}` + "\r\n\r\n", true},
		{"content that spells a usage key", `data: {"id":"c1","choices":[{"index":0,"delta":{"content":"\"usage\":{\"prompt_tokens\":1}"}}],"usage":{"prompt_tokens":8,"completion_tokens":1}}` + "\n\n", true},
		{"only member", `data: {"usage":{"prompt_tokens":8,"completion_tokens":1}}` + "\n\n", false},
		{"data over two lines", "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\ndata: \"usage\":{\"prompt_tokens\":8,\"completion_tokens\":1}}\n\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := []byte(tc.ev)
			payload := sse.Data(ev)
			want, err := sjson.DeleteBytes(payload, "usage")
			if err != nil {
				t.Fatal(err)
			}
			us := gjson.GetBytes(payload, "usage")
			got, ok := cutUsage(ev, payload, us)
			if ok != tc.cut {
				t.Fatalf("cut %v, want %v", ok, tc.cut)
			}
			if !ok {
				if string(ev) != tc.ev {
					t.Fatalf("a declined cut changed the event: %q", ev)
				}
				return
			}
			if len(got) < 8 || string(got[:6]) != "data: " || string(got[len(got)-2:]) != "\n\n" {
				t.Fatalf("not one data line: %q", got)
			}
			var a, b any
			if err := json.Unmarshal(got[6:len(got)-2], &a); err != nil {
				t.Fatalf("cut event is not JSON: %q: %v", got, err)
			}
			if err := json.Unmarshal(want, &b); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("cut %s\nwant %s", got[6:len(got)-2], want)
			}
		})
	}
}

// TestUsageAtEndFindsWhatGjsonFinds: the usage found from the end of a
// chunk is the chunk's own usage member, as gjson finds it reading the
// whole chunk, or nothing (and the caller reads the whole chunk).
func TestUsageAtEndFindsWhatGjsonFinds(t *testing.T) {
	for _, tc := range []struct {
		name, payload string
		found         bool
	}{
		{"vllm chunk", `{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}],"usage":{"prompt_tokens":8,"total_tokens":9,"completion_tokens":1}}`, true},
		{"usage-only chunk", `{"id":"c1","choices":[],"usage":{"prompt_tokens":8,"total_tokens":20,"completion_tokens":12}}`, true},
		{"nested details, trailing space", `{"id":"c1","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":12,"prompt_tokens_details":{"cached_tokens":4}}} `, true},
		{"content that spells a usage member", `{"id":"c1","choices":[{"index":0,"delta":{"content":",\"usage\":{\"prompt_tokens\":1}}"}}],"usage":{"prompt_tokens":8,"completion_tokens":1}}`, true},
		{"usage of a nested object", `{"id":"c1","choices":[{"index":0,"x":{"a":1,"usage":{"prompt_tokens":1}}}]}`, false},
		{"nested usage last in a nested object", `{"id":"c1","x":{"a":1,"usage":{"prompt_tokens":1}}}`, false},
		{"usage first", `{"usage":{"prompt_tokens":8,"completion_tokens":1},"id":"c1","choices":[]}`, false},
		{"no usage", `{"id":"c1","choices":[{"index":0,"delta":{"content":"hi"}}]}`, false},
		{"cut short", `{"id":"c1","choices":[],"usage":{"prompt_tokens":8`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := usageAtEnd([]byte(tc.payload))
			if got.Exists() != tc.found {
				t.Fatalf("found %v (%q), want %v", got.Exists(), got.Raw, tc.found)
			}
			if !tc.found {
				return
			}
			want := gjson.Get(tc.payload, "usage")
			if got.Raw != want.Raw || got.Index != want.Index {
				t.Fatalf("usage %q at %d, gjson finds %q at %d", got.Raw, got.Index, want.Raw, want.Index)
			}
			if got.Get("prompt_tokens").Int() != 8 {
				t.Fatalf("prompt_tokens %d, want 8", got.Get("prompt_tokens").Int())
			}
		})
	}
}
