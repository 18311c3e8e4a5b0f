package server

import (
	"hash/fnv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// gjsonPrefix, gjsonMedia and gjsonPrompts read a request as the gateway
// read it with gjson alone: the prefix hash of the joined lead, the media
// parts of every message, the prompts of a list.
func gjsonPrefix(chat bool, body string) uint64 {
	var lead string
	if chat {
		first := gjson.Get(body, "messages.0")
		lead = first.Get("role").Str + "\x00" + first.Get("content").Raw
	} else {
		lead = gjson.Get(body, "prompt").Raw
	}
	if len(lead) > prefixBytes {
		lead = lead[:prefixBytes]
	}
	if lead == "" || lead == "\x00" {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(lead))
	return h.Sum64()
}

func gjsonMedia(body string) (n int64) {
	gjson.Get(body, "messages").ForEach(func(_, m gjson.Result) bool {
		if c := m.Get("content"); c.IsArray() {
			c.ForEach(func(_, part gjson.Result) bool {
				switch part.Get("type").Str {
				case "text", "refusal", "":
				default:
					n++
				}
				return true
			})
		}
		return true
	})
	return n
}

func gjsonPrompts(body string) int64 {
	p := gjson.Get(body, "prompt")
	if !p.IsArray() {
		return 1
	}
	if first := p.Get("0"); first.Type != gjson.String && !first.IsArray() {
		return 1
	}
	return max(int64(len(p.Array())), 1)
}

// Reading a request by stepping over its values gives the numbers gjson's
// reading gave: the prefix-affinity hash, the media parts reserved, the
// prompts of a list, and so the prompt's bounds.
func TestReadingAsGJSONRead(t *testing.T) {
	long := strings.Repeat("The quick brown fox. ", 40)
	lim := parseLimits{maxDepth: 64, mediaPart: 1000, defaultMax: func(string) int64 { return 64 }}
	for _, tc := range []struct {
		name string
		chat bool
		body string
	}{
		{"short chat", true, `{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"hi"}]}`},
		{"a long first message", true, `{"model":"m","messages":[{"role":"user","content":"` + long + `"}]}`},
		{"a long role", true, `{"model":"m","messages":[{"role":"` + long + `","content":"x"}]}`},
		{"escapes in role and content", true, `{"model":"m","messages":[{"r\u006fle":"us\u0065r","content":"a\"b\\c\n` + long + `"}]}`},
		{"content first, no content", true, `{"model":"m","messages":[{"role":"user"},{"content":"x","role":"user"}]}`},
		{"empty role and content", true, `{"model":"m","messages":[{"role":"","content":""}]}`},
		{"content parts", true, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"` + long + `"},` +
			`{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},"bare",{"t\u0079pe":"input_audio"},{"type":7},{"type":"refusal"}]},` +
			`{"role":"user","content":[{"type":"video_url"},{"kind":"file"}]}]}`},
		{"a string prompt", false, `{"model":"m","prompt":"` + long + `"}`},
		{"an escaped prompt", false, `{"model":"m","prompt":"line\nline\"` + long + `"}`},
		{"a list of prompts", false, `{"model":"m","prompt":["a","b",["c"]],"n":2}`},
		{"a list of token ids", false, `{"model":"m","prompt":[1,2,3]}`},
		{"lists of token ids", false, `{"model":"m","prompt":[[1,2],[3]]}`},
		{"an empty list", false, `{"model":"m","prompt":[]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep := completionEndpoint
			if tc.chat {
				ep = chatEndpoint
			}
			p, err := parseRequest(ep, []byte(tc.body), "", lim)
			if err != nil {
				t.Fatal(err)
			}
			if want := gjsonPrefix(tc.chat, tc.body); p.prefix != want {
				t.Errorf("prefix %#x, gjson's %#x", p.prefix, want)
			}
			if !tc.chat {
				want := gjsonPrompts(tc.body)
				if n := gjson.Get(tc.body, "n"); n.Exists() {
					want *= n.Int()
				}
				if p.sequences != want {
					t.Errorf("%d sequences, gjson's %d", p.sequences, want)
				}
				return
			}
			media := gjsonMedia(tc.body)
			if want := int64(len(tc.body)) + 16 + media*lim.mediaPart; p.promptBound != want {
				t.Errorf("prompt bound %d, gjson's %d (%d media parts)", p.promptBound, want, media)
			}
		})
	}
}
