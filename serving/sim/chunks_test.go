package sim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// streamed is what a client reads from a chat or completions stream.
type streamed struct {
	chunks     []string // the text of each chunk carrying a choice, EOS included
	reasoning  []string // the reasoning chunks
	text       string   // their concatenation
	last       map[string]any
	completion int // usage.completion_tokens of the usage chunk
}

// readStream posts body to path and reads the stream's chunks.
func readStream(t *testing.T, url, path, body string) streamed {
	t.Helper()
	status, _, raw := post(t, url+path, body)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, raw)
	}
	var s streamed
	for _, ev := range events(t, raw) {
		if ev == "[DONE]" {
			continue
		}
		m := decode(t, ev)
		if u, ok := m["usage"].(map[string]any); ok && len(m["choices"].([]any)) == 0 {
			s.completion = int(u["completion_tokens"].(float64))
			continue
		}
		c := m["choices"].([]any)[0].(map[string]any)
		var text any
		if d, ok := c["delta"].(map[string]any); ok {
			if d["role"] != nil {
				continue // the role chunk
			}
			if r, ok := d["reasoning"].(string); ok {
				s.reasoning = append(s.reasoning, r)
				continue
			}
			text = d["content"]
		} else {
			text = c["text"]
		}
		str, ok := text.(string)
		if !ok {
			t.Fatalf("chunk without text: %s", ev)
		}
		s.chunks = append(s.chunks, str)
		s.text += str
		s.last = c
	}
	return s
}

// jsonText returns the text of a non-streamed answer to body.
func jsonText(t *testing.T, url, path, body string) (string, int) {
	t.Helper()
	status, _, raw := post(t, url+path, body)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, raw)
	}
	var a chatAnswer
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatal(err)
	}
	if a.Choices[0].Text != "" {
		return a.Choices[0].Text, a.Usage.CompletionTokens
	}
	return a.Choices[0].Message.Content, a.Usage.CompletionTokens
}

// TestStopEndsWithTheCountedEOS: as from vLLM, a "stop" answer's last chunk
// is the EOS token, empty, and completion_tokens counts it: a client
// counting content events is one short of the usage.
func TestStopEndsWithTheCountedEOS(t *testing.T) {
	_, srv := start(t, Config{})
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hello"}]`},
		{"/v1/completions", `{"prompt":"hello","max_tokens":200`},
	} {
		t.Run(c.path, func(t *testing.T) {
			s := readStream(t, srv.URL, c.path, c.body+`,"stream":true,"stream_options":{"include_usage":true}}`)
			if s.last["finish_reason"] != "stop" || s.chunks[len(s.chunks)-1] != "" {
				t.Errorf("last chunk %v with text %q, want the empty EOS with finish_reason stop", s.last, s.chunks[len(s.chunks)-1])
			}
			words := 0
			for _, w := range s.chunks {
				if w != "" {
					words++
				}
			}
			if words != s.completion-1 || len(s.chunks) != s.completion {
				t.Errorf("%d content events and %d chunks for completion_tokens %d; want %d and %d", words, len(s.chunks), s.completion, s.completion-1, s.completion)
			}
			text, n := jsonText(t, srv.URL, c.path, c.body+`}`)
			if s.text != text || n != s.completion {
				t.Errorf("stream %q (%d tokens), JSON %q (%d tokens)", s.text, s.completion, text, n)
			}
		})
	}
}

// TestNoEOSTokenKeepsOneWordPerToken: the knob restores the simulator's
// older shape, every counted token a word.
func TestNoEOSTokenKeepsOneWordPerToken(t *testing.T) {
	_, srv := start(t, Config{NoEOSToken: true})
	s := readStream(t, srv.URL, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hello"}],"stream":true,"stream_options":{"include_usage":true}}`)
	if s.last["finish_reason"] != "stop" || len(s.chunks) != s.completion || s.chunks[len(s.chunks)-1] == "" {
		t.Errorf("%d chunks ending %q for completion_tokens %d; want one word per token", len(s.chunks), s.chunks[len(s.chunks)-1], s.completion)
	}
}

// TestStreamIntervalMergesTokens: with --stream-interval (Config) or the
// request's stream_interval, chunks carry several tokens as vLLM's do: the
// first token alone, then interval tokens a chunk, the rest last.
func TestStreamIntervalMergesTokens(t *testing.T) {
	const chat = `{"messages":[{"role":"user","content":"hello"}]`
	for _, c := range []struct {
		name     string
		cfg      Config
		path     string
		body     string // without its closing brace
		interval int
	}{
		{"engine interval", Config{StreamInterval: 4}, "/v1/chat/completions", chat, 4},
		{"request interval", Config{}, "/v1/chat/completions", chat + `,"stream_interval":5`, 5},
		{"request below the engine's is raised", Config{StreamInterval: 4}, "/v1/chat/completions", chat + `,"stream_interval":2`, 4},
		{"completions", Config{}, "/v1/completions", `{"prompt":"hello","max_tokens":200,"stream_interval":3`, 3},
		{"with reasoning", Config{ReasoningTokens: 6, StreamInterval: 4}, "/v1/chat/completions", chat, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, srv := start(t, c.cfg)
			s := readStream(t, srv.URL, c.path, c.body+`,"stream":true,"stream_options":{"include_usage":true}}`)
			text, n := jsonText(t, srv.URL, c.path, c.body+`}`)
			if s.text != text || n != s.completion {
				t.Errorf("stream %q (%d tokens), JSON %q (%d tokens)", s.text, s.completion, text, n)
			}
			if len(s.chunks) >= s.completion-c.cfg.ReasoningTokens-1 {
				t.Errorf("%d chunks for %d tokens: tokens were not merged", len(s.chunks), s.completion)
			}
			// Every chunk but the first and the last holds interval words
			// (the reasoning phase ends a chunk early; it is not counted
			// here).
			if c.cfg.ReasoningTokens > 0 {
				// 6 reasoning tokens: the first alone, then 4, then the
				// last one, cut short where the answer starts.
				if len(s.reasoning) != 3 || strings.Join(s.reasoning, "") != jsonReasoning(t, srv.URL, c.body+`}`) {
					t.Errorf("reasoning chunks %q", s.reasoning)
				}
			} else {
				for i, w := range s.chunks[1 : len(s.chunks)-1] {
					if got := len(strings.Fields(w)); got != c.interval {
						t.Errorf("chunk %d %q holds %d words, want %d", i+1, w, got, c.interval)
					}
				}
				if got := len(strings.Fields(s.chunks[0])); got != 1 {
					t.Errorf("first chunk %q holds %d words, want 1", s.chunks[0], got)
				}
			}
			if s.last["finish_reason"] != "stop" {
				t.Errorf("last chunk %v, want finish_reason stop", s.last)
			}
		})
	}
}

func TestStreamIntervalIsValidated(t *testing.T) {
	_, srv := start(t, Config{})
	status, _, body := post(t, srv.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_interval":0}`)
	want := `{"error":{"message":"1 validation error:\n  {'type': 'greater_than_equal', 'loc': 'body.stream_interval', 'msg': 'Input should be greater than or equal to 1', 'input': '0', 'ctx': {'ge': 1}}","type":"Bad Request","param":"body.stream_interval","code":400}}`
	if status != http.StatusBadRequest || string(body) != want {
		t.Errorf("status %d\n got %s\nwant %s", status, body, want)
	}
}

func jsonReasoning(t *testing.T, url, body string) string {
	t.Helper()
	_, _, raw := post(t, url+"/v1/chat/completions", body)
	var a struct {
		Choices []struct{ Message struct{ Reasoning string } }
	}
	if err := json.Unmarshal(raw, &a); err != nil || len(a.Choices) != 1 {
		t.Fatalf("decode %s: %v", raw, err)
	}
	return a.Choices[0].Message.Reasoning
}
