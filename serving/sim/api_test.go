package sim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type chatAnswer struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Text         string          `json:"text"`
		FinishReason string          `json:"finish_reason"`
		Logprobs     json.RawMessage `json:"logprobs"`
	} `json:"choices"`
	Usage usage `json:"usage"`
}

func TestChatAnswerCarriesDocumentedUsage(t *testing.T) {
	_, srv := start(t, Config{Model: "m"})
	tests := []struct {
		name       string
		body       string
		prompt     int    // 3 + Σ (4 + ⌈bytes/4⌉), worked out by hand
		text       string // concatenated contents
		completion int    // 0: the natural length of text
		finish     string
	}{
		{
			name:   "one string message",
			body:   `{"model":"m","messages":[{"role":"user","content":"hello"}]}`,
			prompt: 3 + 4 + 2, text: "hello", finish: "stop",
		},
		{
			name:   "system and user",
			body:   `{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hi"}]}`,
			prompt: 3 + (4 + 4) + (4 + 2), text: "You are terse.Say hi", finish: "stop",
		},
		{
			name:   "text parts count as one content",
			body:   `{"messages":[{"role":"user","content":[{"type":"text","text":"abc"},{"type":"text","text":"defgh"}]}]}`,
			prompt: 3 + 4 + 2, text: "abcdefgh", finish: "stop",
		},
		{
			name:   "null content counts as empty",
			body:   `{"messages":[{"role":"assistant","content":null},{"role":"user","content":"x"}]}`,
			prompt: 3 + 4 + (4 + 1), text: "x", finish: "stop",
		},
		{
			name:   "multibyte content counts bytes",
			body:   `{"messages":[{"role":"user","content":"héllo wörld"}]}`,
			prompt: 3 + 4 + 4, text: "héllo wörld", finish: "stop",
		},
		{
			name:   "max_tokens caps the answer",
			body:   `{"messages":[{"role":"user","content":"hello"}],"max_tokens":3}`,
			prompt: 9, text: "hello", completion: 3, finish: "length",
		},
		{
			name:   "max_completion_tokens wins over max_tokens",
			body:   `{"messages":[{"role":"user","content":"hello"}],"max_tokens":10,"max_completion_tokens":2}`,
			prompt: 9, text: "hello", completion: 2, finish: "length",
		},
		{
			name:   "ignore_eos generates exactly max_tokens",
			body:   `{"messages":[{"role":"user","content":"hello"}],"max_tokens":300,"ignore_eos":true}`,
			prompt: 9, text: "hello", completion: 300, finish: "length",
		},
		{
			name:   "min_tokens lengthens a short answer; the EOS comes after them",
			body:   `{"messages":[{"role":"user","content":"hello"}],"max_tokens":250,"min_tokens":200}`,
			prompt: 9, text: "hello", completion: 201, finish: "stop",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, hdr, body := post(t, srv.URL+"/v1/chat/completions", tt.body)
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, body)
			}
			if ct := hdr.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			var a chatAnswer
			if err := json.Unmarshal(body, &a); err != nil {
				t.Fatalf("decode %s: %v", body, err)
			}
			want := tt.completion
			if want == 0 {
				want = naturalLength(tt.text)
			}
			if a.Usage != (usage{tt.prompt, want, tt.prompt + want}) {
				t.Errorf("usage = %+v, want prompt %d completion %d", a.Usage, tt.prompt, want)
			}
			if !strings.HasPrefix(a.ID, "chatcmpl-") || a.Object != "chat.completion" || a.Model != "m" || a.Created == 0 {
				t.Errorf("envelope = id %q object %q model %q created %d", a.ID, a.Object, a.Model, a.Created)
			}
			if len(a.Choices) != 1 {
				t.Fatalf("%d choices", len(a.Choices))
			}
			c := a.Choices[0]
			if c.Index != 0 || c.Message.Role != "assistant" || c.FinishReason != tt.finish || string(c.Logprobs) != "null" {
				t.Errorf("choice = index %d role %q finish %q logprobs %s", c.Index, c.Message.Role, c.FinishReason, c.Logprobs)
			}
			words := want
			if tt.finish == "stop" {
				words-- // the EOS token counts but has no text
			}
			if got := len(strings.Fields(c.Message.Content)); got != words {
				t.Errorf("content has %d words, want one per token but the EOS (%d)", got, words)
			}
			_, _, again := post(t, srv.URL+"/v1/chat/completions", tt.body)
			var b chatAnswer
			_ = json.Unmarshal(again, &b)
			if len(b.Choices) != 1 || b.Choices[0].Message.Content != c.Message.Content {
				t.Errorf("same prompt answered differently")
			}
			if b.ID == a.ID {
				t.Errorf("two answers share id %q", a.ID)
			}
		})
	}
}

func TestCompletionAnswerCarriesDocumentedUsage(t *testing.T) {
	_, srv := start(t, Config{Model: "m"})
	tests := []struct {
		name   string
		body   string
		prompt int // 1 + ⌈bytes/4⌉
		text   string
	}{
		{"string prompt", `{"model":"m","prompt":"hello world","max_tokens":200}`, 1 + 3, "hello world"},
		{"array of one string", `{"prompt":["abcd"],"max_tokens":200}`, 1 + 1, "abcd"},
		{"array of one empty string", `{"prompt":[""],"max_tokens":200}`, 1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, _, body := post(t, srv.URL+"/v1/completions", tt.body)
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, body)
			}
			var a chatAnswer
			if err := json.Unmarshal(body, &a); err != nil {
				t.Fatal(err)
			}
			want := naturalLength(tt.text)
			if a.Usage != (usage{tt.prompt, want, tt.prompt + want}) {
				t.Errorf("usage = %+v, want prompt %d completion %d", a.Usage, tt.prompt, want)
			}
			if !strings.HasPrefix(a.ID, "cmpl-") || a.Object != "text_completion" || a.Model != "m" {
				t.Errorf("envelope = id %q object %q model %q", a.ID, a.Object, a.Model)
			}
			if len(a.Choices) != 1 || len(strings.Fields(a.Choices[0].Text)) != want-1 || a.Choices[0].FinishReason != "stop" {
				t.Errorf("choices = %+v", a.Choices)
			}
		})
	}
}

// TestCompletionsDefaultTo16Tokens: without max_tokens, /v1/completions
// stops at 16 tokens as vLLM's CompletionRequest does; chat keeps the
// engine's default.
func TestCompletionsDefaultTo16Tokens(t *testing.T) {
	_, srv := start(t, Config{})
	text, n := jsonText(t, srv.URL, "/v1/completions", `{"prompt":"hello world"}`)
	if n != 16 || len(strings.Fields(text)) != 16 {
		t.Errorf("completion of %d tokens (%q), want vLLM's default 16", n, text)
	}
	// An explicit null is pydantic's None: no default of 16, the engine's
	// own cap (vLLM: the rest of the context).
	if _, n := jsonText(t, srv.URL, "/v1/completions", `{"prompt":"hello world","max_tokens":null,"ignore_eos":true}`); n != defaultMaxTokens {
		t.Errorf("completion with max_tokens null: %d tokens, want the engine's cap %d", n, defaultMaxTokens)
	}
	if _, n := jsonText(t, srv.URL, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hello world"}]}`); n != naturalLength("hello world") {
		t.Errorf("chat answer of %d tokens, want its natural length %d", n, naturalLength("hello world"))
	}
}

// TestModelsListsTheServedModel pins /v1/models: vLLM's ModelCard with
// owned_by "vllm", root, parent null and one ModelPermission.
func TestModelsListsTheServedModel(t *testing.T) {
	_, srv := start(t, Config{Model: "org/model-7b", MaxModelLen: 4096})
	status, body := get(t, srv.URL+"/v1/models")
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	const want = `{"object":"list","data":[{"id":"org/model-7b","object":"model","created":0,"owned_by":"vllm","root":"org/model-7b","parent":null,"max_model_len":4096,"permission":[{"id":"modelperm-ID","object":"model_permission","created":0,"allow_create_engine":false,"allow_sampling":true,"allow_logprobs":true,"allow_search_indices":false,"allow_view":true,"allow_fine_tuning":false,"organization":"*","group":null,"is_blocking":false}]}]}`
	if got := normalize(string(body)); got != want {
		t.Errorf("models\n got %s\nwant %s", got, want)
	}
}

func TestDefaultModelName(t *testing.T) {
	_, srv := start(t, Config{})
	_, body := get(t, srv.URL+"/v1/models")
	if !strings.Contains(string(body), `"id":"tailgate-sim"`) {
		t.Errorf("models = %s", body)
	}
	status, _, _ := post(t, srv.URL+"/v1/chat/completions", `{"model":"tailgate-sim","messages":[{"role":"user","content":"hi"}]}`)
	if status != http.StatusOK {
		t.Errorf("status %d", status)
	}
}

// TestBadRequestsGetVLLMErrors pins the status, type and param of each
// refusal: "Bad Request" with a dotted location for what pydantic rejects
// (vllm/entrypoints/serve/exception_handling/handlers/validation.py@4da14a5c),
// the parameter of a VLLMValidationError raised by a model validator, and
// "BadRequestError" / "NotFoundError" for what the handlers refuse.
func TestBadRequestsGetVLLMErrors(t *testing.T) {
	_, srv := start(t, Config{Model: "m", MaxModelLen: 1000})
	const chat, cmpl = "/v1/chat/completions", "/v1/completions"
	const hello = `"messages":[{"role":"user","content":"hello"}]`
	const invalid, semantic, notFound = "Bad Request", "BadRequestError", "NotFoundError"
	tests := []struct {
		name   string
		path   string
		body   string
		status int
		typ    string
		param  any // nil for null
	}{
		{"invalid JSON", chat, `{"messages":`, 400, invalid, "body.12"},
		{"body not an object", chat, `[1,2]`, 400, invalid, "body"},
		{"missing messages", chat, `{"model":"m"}`, 400, invalid, "body.messages"},
		{"empty messages", chat, `{"messages":[]}`, 400, semantic, "messages"},
		{"messages not an array", chat, `{"messages":"hello"}`, 400, invalid, "body.messages"},
		{"content a number", chat, `{"messages":[{"role":"user","content":5}]}`, 400, invalid, "body.messages.0.content"},
		{"image part", chat, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, semantic, "messages"},
		{"missing role", chat, `{"messages":[{"content":"hello"}]}`, 400, invalid, "body.messages.0.role"},
		{"n zero", chat, `{` + hello + `,"n":0}`, 400, semantic, "n"},
		{"max_tokens a string", chat, `{` + hello + `,"max_tokens":"ten"}`, 400, invalid, "body.max_tokens"},
		{"temperature a word", chat, `{` + hello + `,"temperature":"hot"}`, 400, invalid, "body.temperature"},
		{"top_p a list", chat, `{` + hello + `,"top_p":[1]}`, 400, invalid, "body.top_p"},
		{"stream a word", chat, `{` + hello + `,"stream":"often"}`, 400, invalid, "body.stream"},
		{"max_tokens zero", chat, `{` + hello + `,"max_tokens":0}`, 400, semantic, "max_tokens"},
		{"min_tokens above max_tokens", chat, `{` + hello + `,"max_tokens":5,"min_tokens":6}`, 400, semantic, "min_tokens"},
		{"stream_options without stream", chat, `{` + hello + `,"stream_options":{"include_usage":true}}`, 400, invalid, "stream_options"},
		{"context too long", chat, `{` + hello + `,"max_tokens":995}`, 400, semantic, "input_tokens"},
		{"max_tokens above the context", chat, `{` + hello + `,"max_tokens":1001}`, 400, semantic, "max_tokens"},
		{"empty tools", chat, `{` + hello + `,"tools":[]}`, 400, invalid, "tools"},
		{"tool_choice without tools", chat, `{` + hello + `,"tool_choice":"required"}`, 400, invalid, "tool_choice"},
		{"unknown model", chat, `{"model":"other",` + hello + `}`, 404, notFound, "model"},
		{"prompt missing", cmpl, `{"model":"m"}`, 400, invalid, "prompt"},
		{"empty prompt", cmpl, `{"prompt":""}`, 400, invalid, "prompt"},
		{"batched prompts", cmpl, `{"prompt":["a","b"]}`, 400, semantic, "prompt"},
		{"token id prompt", cmpl, `{"prompt":[1,2,3]}`, 400, semantic, "prompt"},
		{"completions unknown model", cmpl, `{"model":"other","prompt":"x"}`, 404, notFound, "model"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, hdr, body := post(t, srv.URL+tt.path, tt.body)
			if status != tt.status {
				t.Errorf("status = %d, want %d (%s)", status, tt.status, body)
			}
			if ct := hdr.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			var e struct {
				Error map[string]any `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil || len(e.Error) != 4 {
				t.Fatalf("error body %s does not have OpenAI's shape", body)
			}
			if msg, _ := e.Error["message"].(string); msg == "" || strings.Contains(msg, "sim.") {
				t.Errorf("message = %q", e.Error["message"])
			}
			if e.Error["type"] != tt.typ || e.Error["param"] != tt.param || e.Error["code"] != float64(tt.status) {
				t.Errorf("error = %v, want type %q param %v", e.Error, tt.typ, tt.param)
			}
		})
	}
}

func TestOtherRoutes(t *testing.T) {
	_, srv := start(t, Config{})
	status, body := get(t, srv.URL+"/health")
	if status != http.StatusOK || len(body) != 0 {
		t.Errorf("/health = %d %q, want 200 and no body", status, body)
	}
	if status, _ := get(t, srv.URL+"/v1/nope"); status != http.StatusNotFound {
		t.Errorf("unknown route = %d, want 404", status)
	}
	if status, _ := get(t, srv.URL+"/v1/chat/completions"); status != http.StatusMethodNotAllowed {
		t.Errorf("GET chat = %d, want 405", status)
	}
}
