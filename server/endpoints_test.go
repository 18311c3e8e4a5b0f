package server_test

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// vllmLike answers the endpoints vLLM serves beside chat and completions
// in vLLM's shapes (vllm/entrypoints/openai/*/protocol.py), and records
// what it was sent.
func vllmLike(t *testing.T, got *[]string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		*got = append(*got, r.URL.Path+" "+r.Header.Get("Content-Type"))
		stream := bytes.Contains(body, []byte(`"stream":true`))
		switch r.URL.Path {
		case "/v1/embeddings":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"embd-1","object":"list","created":1,"model":"broken","data":[{"index":0,"object":"embedding","embedding":[0.1,0.2]}],"usage":{"prompt_tokens":7,"total_tokens":7,"completion_tokens":0,"prompt_tokens_details":null}}`)
		case "/v1/responses":
			if !stream {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"id":"resp_1","object":"response","created_at":1,"model":"broken","status":"completed","output":[{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Hi","annotations":[]}]}],"usage":{"input_tokens":11,"output_tokens":3,"total_tokens":14,"input_tokens_details":{"cached_tokens":0},"output_tokens_details":{"reasoning_tokens":0}}}`)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			for _, ev := range []string{
				`{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","created_at":1,"model":"broken","status":"in_progress","output":[]}}`,
				`{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi"}`,
				`{"type":"response.completed","sequence_number":2,"response":{"id":"resp_1","object":"response","created_at":1,"model":"broken","status":"completed","output":[],"usage":{"input_tokens":11,"output_tokens":5,"total_tokens":16}}}`,
			} {
				io.WriteString(w, "event: "+gjsonType(ev)+"\ndata: "+ev+"\n\n")
			}
		case "/v1/rerank", "/rerank":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"rerank-1","model":"broken","usage":{"total_tokens":21},"results":[{"index":1,"document":{"text":"b"},"relevance_score":0.9}]}`)
		case "/v1/score":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"score-1","object":"list","created":1,"model":"broken","data":[{"index":0,"object":"score","score":0.5}],"usage":{"prompt_tokens":9,"total_tokens":9,"completion_tokens":0}}`)
		case "/tokenize":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"count":2,"max_model_len":4096,"tokens":[1,2],"token_strs":null}`)
		case "/v1/audio/transcriptions":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"text":"hello world","usage":{"type":"duration","seconds":2}}`)
		case "/v1/messages":
			w.Header().Set("Content-Type", "text/event-stream")
			for _, ev := range []string{
				`{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"broken","stop_reason":null,"usage":{"input_tokens":13,"output_tokens":0}}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`,
				`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":4}}`,
				`{"type":"message_stop"}`,
			} {
				io.WriteString(w, "event: "+gjsonType(ev)+"\ndata: "+ev+"\n\n")
			}
		default:
			w.WriteHeader(404)
		}
	}
}

func gjsonType(ev string) string {
	var v struct{ Type string }
	_ = json.Unmarshal([]byte(ev), &v)
	return v.Type
}

// TestVLLMEndpointsAreProxiedAndMetered: every endpoint vLLM serves beside
// chat and completions is authenticated, routed by model, relayed as the
// engine answered and billed from the engine's own usage.
func TestVLLMEndpointsAreServedAndMetered(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	var got []string
	fakeEngine(t, h, "vllm", vllmLike(t, &got))
	secret := h.Key(policy.KeyOptions{})
	c := h.Client(secret)

	// Through the official SDK: embeddings and the Responses API, JSON and streamed.
	emb, err := c.Embeddings.New(t.Context(), openai.EmbeddingNewParams{Model: "broken",
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("hello")}})
	if err != nil || len(emb.Data) != 1 || emb.Usage.PromptTokens != 7 {
		t.Fatalf("embeddings: %v %+v", err, emb)
	}
	resp, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: "broken",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}})
	if err != nil || resp.OutputText() != "Hi" {
		t.Fatalf("responses: %v %+v", err, resp)
	}
	st := c.Responses.NewStreaming(t.Context(), responses.ResponseNewParams{Model: "broken",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}})
	var text string
	for st.Next() {
		if ev := st.Current(); ev.Type == "response.output_text.delta" {
			text += ev.Delta
		}
	}
	if st.Err() != nil || text != "Hi" {
		t.Fatalf("streamed responses: %v %q", st.Err(), text)
	}

	// Raw HTTP: rerank, score, tokenize, audio, Anthropic messages.
	for _, tc := range []struct{ path, body string }{
		{"/v1/rerank", `{"model":"broken","query":"q","documents":["a","b"]}`},
		{"/rerank", `{"model":"broken","query":"q","documents":["a","b"]}`},
		{"/v1/score", `{"model":"broken","text_1":"a","text_2":"b"}`},
		{"/tokenize", `{"model":"broken","prompt":"hi"}`},
		{"/v1/messages", `{"model":"broken","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hi"}]}`},
	} {
		r := h.Post(tc.path, secret, tc.body)
		raw, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != 200 || len(raw) == 0 {
			t.Fatalf("%s: %d %s", tc.path, r.StatusCode, raw)
		}
	}
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	mw.WriteField("model", "broken")
	fw, _ := mw.CreateFormFile("file", "a.wav")
	fw.Write(bytes.Repeat([]byte{1}, 4096))
	mw.Close()
	r := h.Do(http.MethodPost, "/v1/audio/transcriptions", secret, mw.FormDataContentType(), &mp)
	raw, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode != 200 || !strings.Contains(string(raw), "hello world") {
		t.Fatalf("audio: %d %s", r.StatusCode, raw)
	}
	if last := got[len(got)-1]; !strings.HasPrefix(last, "/v1/audio/transcriptions multipart/form-data; boundary=") {
		t.Fatalf("the engine got %q", last)
	}

	// Unknown routes answer 404 in OpenAI's shape; another key's model is 403.
	r = h.Post("/v1/fine_tuning/jobs", secret, `{}`)
	code, _, _ := decodeError(t, r)
	r.Body.Close()
	if r.StatusCode != 404 || code == "" {
		t.Fatalf("unknown route: %d %q", r.StatusCode, code)
	}
	narrow := h.Key(policy.KeyOptions{Tenant: "narrow", Models: []string{"other"}})
	if r = h.Post("/v1/embeddings", narrow, `{"model":"broken","input":"x"}`); r.StatusCode != 403 {
		t.Fatalf("a key without the model: %d", r.StatusCode)
	}
	r.Body.Close()

	want := map[string][2]int64{ // prompt, completion billed per request, in order
		"embeddings": {7, 0}, "responses": {11, 3}, "responses-stream": {11, 5}, "rerank": {21, 0}, "rerank2": {21, 0},
		"score": {9, 0}, "tokenize": {0, 0}, "messages": {13, 4},
		// 2 s of audio at Whisper's 50 encoder tokens a second; "hello
		// world" at ~4 bytes a token (the engine reports only seconds).
		"audio": {100, 3},
	}
	order := []string{"embeddings", "responses", "responses-stream", "rerank", "rerank2", "score", "tokenize", "messages", "audio"}
	var rows []data.LedgerRow
	for _, row := range h.LedgerRows() {
		if row.Outcome == data.OutcomeOK {
			rows = append(rows, row)
		}
	}
	if len(rows) != len(order) {
		t.Fatalf("%d ok rows, want %d: %+v", len(rows), len(order), rows)
	}
	for i, name := range order {
		w := want[name]
		if rows[i].PromptTokens != w[0] || rows[i].CompletionTokens != w[1] || rows[i].Model != "broken" {
			t.Errorf("%s: billed %d+%d for %s, want %d+%d", name, rows[i].PromptTokens, rows[i].CompletionTokens, rows[i].Model, w[0], w[1])
		}
	}
}
