package sim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func TestChatStreamEventOrder(t *testing.T) {
	_, srv := start(t, Config{Model: "m", TPOT: 1}) // TPOT>0: one write per token
	const msgs = `"messages":[{"role":"user","content":"hello"}],"max_tokens":5,"ignore_eos":true`

	status, hdr, body := post(t, srv.URL+"/v1/chat/completions",
		`{"model":"m",`+msgs+`,"stream":true,"stream_options":{"include_usage":true}}`)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Errorf("Content-Type = %q", ct)
	}
	ev := events(t, body)
	if len(ev) != 1+5+1+1 {
		t.Fatalf("got %d events, want role + 5 tokens + usage + [DONE]:\n%s", len(ev), body)
	}
	if ev[len(ev)-1] != "[DONE]" {
		t.Errorf("last event = %q, want [DONE]", ev[len(ev)-1])
	}

	var id string
	var content strings.Builder
	for i, e := range ev[:len(ev)-1] {
		m := decode(t, e)
		if m["object"] != "chat.completion.chunk" || m["model"] != "m" {
			t.Errorf("event %d envelope = %s", i, e)
		}
		if i == 0 {
			id, _ = m["id"].(string)
		} else if m["id"] != id {
			t.Errorf("event %d id %v, want %s", i, m["id"], id)
		}
		choices, _ := m["choices"].([]any)
		switch {
		case i == 0:
			c := choices[0].(map[string]any)
			if d := c["delta"].(map[string]any); len(d) != 2 || d["role"] != "assistant" || d["content"] != "" {
				t.Errorf("first delta = %v, want role and empty content", d)
			}
			if c["finish_reason"] != nil {
				t.Errorf("first chunk finish_reason = %v", c["finish_reason"])
			}
		case i <= 5:
			c := choices[0].(map[string]any)
			d := c["delta"].(map[string]any)
			word, _ := d["content"].(string)
			if len(d) != 1 || !strings.HasSuffix(word, " ") {
				t.Errorf("token delta = %v, want one word", d)
			}
			content.WriteString(word)
			want := any(nil)
			if i == 5 {
				want = "length"
			}
			if c["finish_reason"] != want {
				t.Errorf("event %d finish_reason = %v, want %v", i, c["finish_reason"], want)
			}
		default:
			if len(choices) != 0 {
				t.Errorf("usage chunk choices = %v, want []", choices)
			}
			var u struct{ Usage usage }
			_ = json.Unmarshal([]byte(e), &u)
			if u.Usage != (usage{9, 5, 14}) {
				t.Errorf("usage = %+v, want 9+5", u.Usage)
			}
		}
		if _, ok := m["usage"]; ok && i != 6 {
			t.Errorf("event %d carries usage: %s", i, e)
		}
	}

	// The stream says what the JSON answer says.
	_, _, plain := post(t, srv.URL+"/v1/chat/completions", `{"model":"m",`+msgs+`}`)
	var a chatAnswer
	_ = json.Unmarshal(plain, &a)
	if len(a.Choices) != 1 || a.Choices[0].Message.Content != content.String() {
		t.Errorf("streamed %q, JSON answer %s", content.String(), plain)
	}
}

func TestChatStreamWithoutUsage(t *testing.T) {
	_, srv := start(t, Config{})
	_, _, body := post(t, srv.URL+"/v1/chat/completions",
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"ignore_eos":true,"stream":true}`)
	ev := events(t, body)
	if len(ev) != 1+3+1 || ev[4] != "[DONE]" {
		t.Fatalf("events = %q", ev)
	}
	if strings.Contains(string(body), "usage") {
		t.Errorf("usage sent though not asked for:\n%s", body)
	}
	last := decode(t, ev[3])["choices"].([]any)[0].(map[string]any)
	if last["finish_reason"] != "length" {
		t.Errorf("last token chunk = %v", last)
	}
}

func TestChatStreamContinuousUsage(t *testing.T) {
	_, srv := start(t, Config{})
	_, _, body := post(t, srv.URL+"/v1/chat/completions",
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"ignore_eos":true,"stream":true,`+
			`"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`)
	ev := events(t, body)
	if len(ev) != 1+3+1+1 {
		t.Fatalf("events = %q", ev)
	}
	for i, e := range ev[:5] {
		var u struct{ Usage *usage }
		_ = json.Unmarshal([]byte(e), &u)
		want := min(i, 3)
		if u.Usage == nil || *u.Usage != (usage{8, want, 8 + want}) {
			t.Errorf("event %d usage = %+v, want completion %d", i, u.Usage, want)
		}
	}
}

func TestCompletionStream(t *testing.T) {
	_, srv := start(t, Config{Model: "m"})
	status, _, body := post(t, srv.URL+"/v1/completions",
		`{"model":"m","prompt":"hello world","max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`)
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	ev := events(t, body)
	if len(ev) != 4+1+1 || ev[5] != "[DONE]" {
		t.Fatalf("events = %q", ev)
	}
	var text strings.Builder
	for i, e := range ev[:4] {
		m := decode(t, e)
		if m["object"] != "text_completion" || !strings.HasPrefix(m["id"].(string), "cmpl-") {
			t.Errorf("event %d envelope = %s", i, e)
		}
		c := m["choices"].([]any)[0].(map[string]any)
		text.WriteString(c["text"].(string))
		want := any(nil)
		if i == 3 {
			want = "length"
		}
		if c["finish_reason"] != want {
			t.Errorf("event %d finish_reason = %v, want %v", i, c["finish_reason"], want)
		}
	}
	if got := len(strings.Fields(text.String())); got != 4 {
		t.Errorf("streamed %q, want 4 words", text.String())
	}
	var u struct {
		Choices []any
		Usage   usage
	}
	_ = json.Unmarshal([]byte(ev[4]), &u)
	if len(u.Choices) != 0 || u.Usage != (usage{4, 4, 8}) {
		t.Errorf("usage chunk = %s", ev[4])
	}
}
