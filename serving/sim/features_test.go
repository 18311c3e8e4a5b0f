package sim

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/serving/sse"
)

// answerChoice is a chat answer's choice as the tool tests read it.
type answerChoice struct {
	Index   int `json:"index"`
	Message struct {
		Content   *string `json:"content"`
		ToolCalls []struct {
			ID       string `json:"id"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"message"`
	FinishReason string `json:"finish_reason"`
}

// chatChoices posts a chat body and decodes the answer's choices.
func chatChoices(t *testing.T, url, body string) []answerChoice {
	t.Helper()
	status, _, b := post(t, url+"/v1/chat/completions", body)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, b)
	}
	var a struct {
		Choices []answerChoice `json:"choices"`
	}
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return a.Choices
}

// TestToolCallRule pins the documented rule: which requests call a tool,
// which tool, and with what arguments.
func TestToolCallRule(t *testing.T) {
	srv := startWith(t, Config{})
	const (
		two = `"tools":[{"type":"function","function":{"name":"a","parameters":{"type":"object","properties":{"q":{"type":"string"},"n":{"type":"integer"},"x":{"type":"number"},"ok":{"type":"boolean"},"more":{"type":"string"}}}}},` +
			`{"type":"function","function":{"name":"b"}}]`
		afterTool = `"messages":[{"role":"user","content":"hi"},{"role":"tool","tool_call_id":"1","content":"42"}]`
	)
	tests := []struct {
		name, body string
		tool       string // "" for a text answer
		finish     string
	}{
		{"no tools", `{` + user + `}`, "", "stop"},
		{"tool_choice none", `{` + user + `,` + two + `,"tool_choice":"none"}`, "", "stop"},
		{"auto calls", `{` + user + `,` + two + `}`, "a or b", "tool_calls"},
		{"auto answers a tool result", `{` + afterTool + `,` + two + `}`, "", "stop"},
		{"required calls after a tool result too", `{` + afterTool + `,` + two + `,"tool_choice":"required"}`, "a or b", "tool_calls"},
		{"named calls that tool", `{` + user + `,` + two + `,"tool_choice":{"type":"function","function":{"name":"b"}}}`, "b", "stop"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := chatChoices(t, srv.URL, tt.body)[0]
			if c.FinishReason != tt.finish {
				t.Errorf("finish_reason = %q, want %q", c.FinishReason, tt.finish)
			}
			if tt.tool == "" {
				if len(c.Message.ToolCalls) != 0 || c.Message.Content == nil || *c.Message.Content == "" {
					t.Errorf("want a text answer, got %+v", c.Message)
				}
				return
			}
			if len(c.Message.ToolCalls) != 1 {
				t.Fatalf("want one tool call, got %+v", c.Message)
			}
			call := c.Message.ToolCalls[0]
			if !strings.Contains(tt.tool, call.Function.Name) || !strings.HasPrefix(call.ID, "chatcmpl-tool-") {
				t.Errorf("call = %+v, want %s", call, tt.tool)
			}
			var args map[string]any
			if err := json.Unmarshal([]byte(call.Function.Arguments), &args); err != nil {
				t.Fatalf("arguments %q are not JSON: %v", call.Function.Arguments, err)
			}
			if call.Function.Name == "b" && len(args) != 0 {
				t.Errorf("b has no parameters, got %v", args)
			}
			if call.Function.Name == "a" {
				// At most four properties, typed by the schema.
				_, isStr := args["q"].(string)
				_, isNum := args["x"].(float64)
				_, isBool := args["ok"].(bool)
				if len(args) != 4 || !isStr || !isNum || !isBool || args["n"] != math.Trunc(args["n"].(float64)) {
					t.Errorf("arguments %v do not follow the schema", args)
				}
			}
		})
	}

	// The tool is tools[hash % 2]: across prompts both get called.
	seen := map[string]bool{}
	for _, p := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		c := chatChoices(t, srv.URL, `{"messages":[{"role":"user","content":"`+p+`"}],`+two+`}`)[0]
		seen[c.Message.ToolCalls[0].Function.Name] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Errorf("tools called over eight prompts: %v, want both", seen)
	}
}

// TestNChoicesAreDistinctAndBilledTogether: n answers of their own lengths,
// usage the sum, and the same answer again for the same request.
func TestNChoicesAreDistinctAndBilledTogether(t *testing.T) {
	srv := startWith(t, Config{})
	body := `{"messages":[{"role":"user","content":"tell me"}],"n":3}`
	status, _, b := post(t, srv.URL+"/v1/chat/completions", body)
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	var a chatAnswer
	_ = json.Unmarshal(b, &a)
	if len(a.Choices) != 3 {
		t.Fatalf("%d choices", len(a.Choices))
	}
	words := 0
	for i, c := range a.Choices {
		if c.Index != i {
			t.Errorf("choice %d has index %d", i, c.Index)
		}
		words += len(strings.Fields(c.Message.Content))
		if c.FinishReason == "stop" {
			words++ // the EOS token
		}
	}
	if a.Choices[0].Message.Content == a.Choices[1].Message.Content || a.Choices[1].Message.Content == a.Choices[2].Message.Content {
		t.Errorf("choices repeat each other: %+v", a.Choices)
	}
	if a.Choices[0].Message.Content != chatChoicesContent(t, srv.URL, `{"messages":[{"role":"user","content":"tell me"}]}`) {
		t.Errorf("choice 0 differs from the n=1 answer")
	}
	if a.Usage.CompletionTokens != words || a.Usage.PromptTokens != ChatPromptTokens("tell me") {
		t.Errorf("usage = %+v, want %d completion tokens", a.Usage, words)
	}

	// Streamed, every choice's tokens come with their index, and the
	// usage chunk says what the JSON answer said.
	_, _, sb := post(t, srv.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"tell me"}],"n":3,"stream":true,"stream_options":{"include_usage":true}}`)
	texts := make([]strings.Builder, 3)
	var final struct{ Usage usage }
	for _, ev := range events(t, sb) {
		if ev == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Index int
				Delta struct{ Content string }
			}
			Usage *usage
		}
		_ = json.Unmarshal([]byte(ev), &c)
		for _, ch := range c.Choices {
			texts[ch.Index].WriteString(ch.Delta.Content)
		}
		if c.Usage != nil {
			final.Usage = *c.Usage
		}
	}
	for i := range texts {
		if texts[i].String() != a.Choices[i].Message.Content {
			t.Errorf("choice %d streamed %q, answered %q", i, texts[i].String(), a.Choices[i].Message.Content)
		}
	}
	if final.Usage != a.Usage {
		t.Errorf("streamed usage %+v, JSON usage %+v", final.Usage, a.Usage)
	}
}

func chatChoicesContent(t *testing.T, url, body string) string {
	t.Helper()
	c := chatChoices(t, url, body)[0]
	if c.Message.Content == nil {
		return ""
	}
	return *c.Message.Content
}

// TestClassifyFindsTheFirstToken: the gateway's sse.Classify must see the
// first generated delta of any kind — reasoning (under each field name),
// a tool call, content — as the first Token, and the role chunk as none.
func TestClassifyFindsTheFirstToken(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		body string
		want string // a marker of the first token event
	}{
		{"content", Config{}, `{` + user + `,"stream":true}`, `"delta":{"content":"`},
		{"reasoning", Config{ReasoningTokens: 3}, `{` + user + `,"stream":true}`, `"delta":{"reasoning":"`},
		{"reasoning_content", Config{ReasoningTokens: 3, ReasoningField: "reasoning_content"}, `{` + user + `,"stream":true}`, `"delta":{"reasoning_content":"`},
		{"both reasoning fields", Config{ReasoningTokens: 3, ReasoningField: "both"}, `{` + user + `,"stream":true}`, `"delta":{"reasoning":"`},
		{"tool call", Config{}, `{` + user + `,` + tool + `,"stream":true}`, `"delta":{"tool_calls":[{"id":"chatcmpl-tool-`},
		{"tool call after reasoning", Config{ReasoningTokens: 1}, `{` + user + `,` + tool + `,"stream":true}`, `"delta":{"reasoning":"`},
		{"n=2 with continuous usage", Config{}, `{` + user + `,"n":2,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, `"delta":{"content":"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := startWith(t, tt.cfg)
			_, _, body := post(t, srv.URL+"/v1/chat/completions", tt.body)
			br := bufio.NewReader(strings.NewReader(string(body)))
			var kinds []sse.Kind
			var first string
			for {
				ev, err := sse.ReadEvent(br, nil)
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				k := sse.Classify(ev)
				kinds = append(kinds, k)
				if k == sse.Token && first == "" {
					first = string(ev)
				}
			}
			if !strings.Contains(first, tt.want) {
				t.Fatalf("first Token event %q, want one with %s", first, tt.want)
			}
			// Role chunk(s) first, then the queue comment, then the first
			// token, then only tokens up to the end.
			i := 0
			for i < len(kinds) && kinds[i] == sse.Other {
				i++
			}
			if i == 0 || i >= len(kinds) || kinds[i] != sse.Comment || kinds[i+1] != sse.Token {
				t.Errorf("kinds = %v, want role chunks, the comment, then tokens", kinds)
			}
			if kinds[len(kinds)-1] != sse.Done {
				t.Errorf("last event is %v, want Done", kinds[len(kinds)-1])
			}
		})
	}
}

// TestFaultsAreSeededAndShaped: each fault knob alone, then a mix whose
// sequence a seed fixes.
func TestFaultsAreSeededAndShaped(t *testing.T) {
	const body = `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`
	t.Run("500", func(t *testing.T) {
		e, srv := start(t, Config{ErrorRate: 1})
		status, _, b := post(t, srv.URL+"/v1/chat/completions", body)
		want := `{"error":{"message":"The simulated engine failed this request (--sim-error-rate).","type":"InternalServerError","param":null,"code":500}}`
		if status != 500 || string(b) != want {
			t.Errorf("got %d %s", status, b)
		}
		if s := e.Stats(); s.Faulted != 1 || s.Completed != 0 {
			t.Errorf("stats %+v", s)
		}
	})
	t.Run("429", func(t *testing.T) {
		_, srv := start(t, Config{RateLimitRate: 1, RetryAfter: 2500 * time.Millisecond})
		status, hdr, b := post(t, srv.URL+"/v1/embeddings", `{"input":"x"}`)
		if status != 429 || hdr.Get("Retry-After") != "3" || !strings.Contains(string(b), `"type":"RateLimitError","param":null,"code":429}`) {
			t.Errorf("got %d Retry-After %q %s", status, hdr.Get("Retry-After"), b)
		}
	})
	t.Run("a bad request is no fault", func(t *testing.T) {
		_, srv := start(t, Config{ErrorRate: 1})
		if status, _, _ := post(t, srv.URL+"/v1/chat/completions", `{}`); status != 400 {
			t.Errorf("status %d, want the 400 first", status)
		}
	})
	t.Run("hang", func(t *testing.T) {
		e, srv := start(t, Config{HangRate: 1})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		r := openStream(t, ctx, srv.URL+"/v1/chat/completions", `{`+user+`,"stream":true}`)
		got := make(chan string, 1)
		go func() {
			line, _ := r.ReadString('\n')
			got <- line
		}()
		testkit.WaitFor(t, "the hang", func() bool { return e.Stats().Faulted == 1 })
		select {
		case line := <-got:
			t.Fatalf("a hung stream sent %q", line)
		case <-time.After(20 * time.Millisecond):
		}
		cancel()
		testkit.WaitFor(t, "the hang to end with its client", func() bool { return e.Stats().Aborted == 1 })
	})
	t.Run("seeded mix", func(t *testing.T) {
		cfg := Config{Seed: 7, ErrorRate: 0.25, RateLimitRate: 0.25}
		run := func() []int {
			_, srv := start(t, cfg)
			var out []int
			for range 40 {
				s, _, _ := post(t, srv.URL+"/v1/chat/completions", body)
				out = append(out, s)
			}
			return out
		}
		a, b := run(), run()
		count := map[int]int{}
		for i := range a {
			count[a[i]]++
			if a[i] != b[i] {
				t.Fatalf("same seed, different faults: %v vs %v", a, b)
			}
		}
		if count[200] == 0 || count[500] == 0 || count[429] == 0 {
			t.Errorf("statuses %v, want some of each", count)
		}
	})
}

// TestTokenizerAgreesWithUsage: /tokenize counts what generation bills, and
// /detokenize gives the text back.
func TestTokenizerAgreesWithUsage(t *testing.T) {
	srv := startWith(t, Config{})
	msgs := `"messages":[{"role":"system","content":"Be brief, très brief."},{"role":"user","content":[{"type":"text","text":"abc"},{"type":"text","text":"de"}]},{"role":"critic","content":"x"}]`
	var tok struct {
		Count  int     `json:"count"`
		Tokens []int64 `json:"tokens"`
	}
	_, _, b := post(t, srv.URL+"/tokenize", `{`+msgs+`}`)
	_ = json.Unmarshal(b, &tok)
	_, _, b = post(t, srv.URL+"/v1/chat/completions", `{`+msgs+`,"max_tokens":1}`)
	var a chatAnswer
	_ = json.Unmarshal(b, &a)
	if tok.Count != len(tok.Tokens) || tok.Count != a.Usage.PromptTokens {
		t.Errorf("tokenize counts %d (%d ids), the chat bills %d", tok.Count, len(tok.Tokens), a.Usage.PromptTokens)
	}

	prompt := "héllo, wörld — ünïcode\n"
	_, _, b = post(t, srv.URL+"/tokenize", `{"prompt":`+jsonString(prompt)+`}`)
	_ = json.Unmarshal(b, &tok)
	if tok.Count != TextPromptTokens(prompt) {
		t.Errorf("prompt count %d, want %d", tok.Count, TextPromptTokens(prompt))
	}
	ids, _ := json.Marshal(tok.Tokens)
	_, _, b = post(t, srv.URL+"/detokenize", `{"tokens":`+string(ids)+`}`)
	var de struct{ Prompt string }
	_ = json.Unmarshal(b, &de)
	if de.Prompt != "<s>"+prompt {
		t.Errorf("detokenized %q, want %q", de.Prompt, "<s>"+prompt)
	}
}

// TestEmbeddingsAreUnitVectors: floats and base64 say the same, vectors have
// length 1, dimensions keep a prefix direction, and the same input gets
// the same vector.
func TestEmbeddingsAreUnitVectors(t *testing.T) {
	srv := startWith(t, Config{EmbeddingDim: 16})
	embed := func(body string) []json.RawMessage {
		status, _, b := post(t, srv.URL+"/v1/embeddings", body)
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, b)
		}
		var r struct {
			Data []struct {
				Embedding json.RawMessage `json:"embedding"`
			} `json:"data"`
		}
		_ = json.Unmarshal(b, &r)
		out := make([]json.RawMessage, len(r.Data))
		for i, d := range r.Data {
			out[i] = d.Embedding
		}
		return out
	}
	var full, again, short []float64
	_ = json.Unmarshal(embed(`{"input":["same"]}`)[0], &full)
	_ = json.Unmarshal(embed(`{"input":"same"}`)[0], &again)
	_ = json.Unmarshal(embed(`{"input":"same","dimensions":4}`)[0], &short)
	var b64 string
	_ = json.Unmarshal(embed(`{"input":"same","encoding_format":"base64"}`)[0], &b64)
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) != 4*16 {
		t.Fatalf("base64 %q: %v", b64, err)
	}
	norm := 0.0
	for i, x := range full {
		norm += x * x
		if f := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])); float64(f) != x {
			t.Errorf("component %d: float %v, base64 %v", i, x, f)
		}
		if again[i] != x {
			t.Errorf("the same input embeds differently")
		}
	}
	if len(full) != 16 || math.Abs(norm-1) > 1e-6 {
		t.Errorf("len %d, norm² %v", len(full), norm)
	}
	if len(short) != 4 || (short[0] > 0) != (full[0] > 0) || (short[3] > 0) != (full[3] > 0) {
		t.Errorf("dimensions=4 gave %v for %v", short, full[:4])
	}
}

// TestEveryEndpointRefusesAnotherModel: each endpoint names the unknown
// model in a 404.
func TestEveryEndpointRefusesAnotherModel(t *testing.T) {
	srv := startWith(t, Config{Model: "m"})
	for path, body := range map[string]string{
		"/v1/chat/completions": `{"model":"x",` + user + `}`,
		"/v1/completions":      `{"model":"x","prompt":"p"}`,
		"/v1/responses":        `{"model":"x","input":"p"}`,
		"/v1/embeddings":       `{"model":"x","input":"p"}`,
		"/v1/rerank":           `{"model":"x","query":"q","documents":["d"]}`,
		"/v1/score":            `{"model":"x","text_1":"q","text_2":"d"}`,
		"/tokenize":            `{"model":"x","prompt":"p"}`,
		"/detokenize":          `{"model":"x","tokens":[1]}`,
	} {
		status, _, b := post(t, srv.URL+path, body)
		if status != 404 || !strings.Contains(string(b), "The model `x` does not exist.") {
			t.Errorf("%s: %d %s", path, status, b)
		}
	}
	form, ct := multipartForm(t, wav(1), "model", "x")
	if status, _, b := postAs(t, srv.URL+"/v1/audio/transcriptions", ct, form); status != 404 {
		t.Errorf("audio: %d %s", status, b)
	}
}

// TestAnswerIDsFollowXRequestID: like vLLM, an answer's id is built from
// the client's X-Request-Id, so the gateway's id shows through.
func TestAnswerIDsFollowXRequestID(t *testing.T) {
	srv := startWith(t, Config{})
	for path, want := range map[string]string{
		"/v1/chat/completions": `"id":"chatcmpl-req-7"`,
		"/v1/completions":      `"id":"cmpl-req-7"`,
		"/v1/embeddings":       `"id":"embd-req-7"`,
		"/v1/messages":         `"id":"chatcmpl-req-7"`,
	} {
		body := `{"model":"tailgate-sim",` + user + `,"prompt":"p","input":"i","max_tokens":1}`
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Request-Id", "req-7")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), want) {
			t.Errorf("%s: %s, want %s", path, b, want)
		}
	}
}

// TestHungJSONRequestWaitsForItsClient: a hang without a stream sends
// nothing at all, and ends when the client gives up.
func TestHungJSONRequestWaitsForItsClient(t *testing.T) {
	e, srv := start(t, Config{HangRate: 1})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/embeddings", strings.NewReader(`{"input":"x"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	testkit.WaitFor(t, "the hang", func() bool { return e.Stats().Faulted == 1 })
	cancel()
	if err := <-done; err == nil {
		t.Errorf("a hung request was answered")
	}
	testkit.WaitFor(t, "the hang to end with its client", func() bool { return e.Stats().Aborted == 1 })
}
