package server_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// TestLongPromptWithoutMaxTokensIsServed: the gateway caps a request that
// sets no max_tokens with its default (1024), but an engine refuses a
// prompt that leaves less room than max_tokens in its context. A prompt
// that fits the context but not beside the default is served as the engine
// itself would serve it — the rest of the context — once the gateway has
// read the context length from /v1/models; a short prompt still gets the
// default cap.
func TestLongPromptWithoutMaxTokensIsServed(t *testing.T) {
	const contextLen = 2048
	h := servertest.Start(t, servertest.Options{Replicas: 1,
		Sim: sim.Config{Model: servertest.SimModel, TTFT: time.Millisecond, MaxModelLen: contextLen, DefaultMaxTokens: contextLen}})
	// One probe, as the health checker makes them (no loop: a probe that
	// times out on a loaded machine would take the replica out).
	rep := h.Reg.Replicas()[0]
	if _, err := (&server.Prober{Transport: http.DefaultTransport}).Probe(t.Context(), rep); err != nil {
		t.Fatal(err)
	}
	if n := h.Reg.ContextLen(servertest.SimModel); n != contextLen {
		t.Fatalf("the gateway learnt context length %d from /v1/models, want %d", n, contextLen)
	}
	req, _ := http.NewRequest(http.MethodGet, h.Admin.URL+"/admin/v1/replicas", nil)
	req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var view struct {
		Data []struct {
			ContextLen int64 `json:"context_len"`
		} `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&view)
	resp.Body.Close()
	if err != nil || len(view.Data) != 1 || view.Data[0].ContextLen != contextLen {
		t.Errorf("/admin/v1/replicas: %+v (%v), want context_len %d", view, err, contextLen)
	}
	c := h.Client(h.Key(policy.KeyOptions{}))
	long := strings.Repeat("abcd ", 1200) // about 1500 of the 2048 tokens

	chat, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: servertest.SimModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(long)}},
		ignoreEOS())
	if err != nil {
		t.Fatalf("a long chat prompt without max_tokens: %v", err)
	}
	if u := chat.Usage; u.PromptTokens+u.CompletionTokens != contextLen {
		t.Errorf("chat usage %+v: want the rest of the %d-token context generated", u, contextLen)
	}
	text, err := c.Completions.New(t.Context(), openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(servertest.SimModel),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(long)}}, ignoreEOS())
	if err != nil {
		t.Fatalf("a long completions prompt without max_tokens: %v", err)
	}
	if u := text.Usage; u.PromptTokens+u.CompletionTokens != contextLen {
		t.Errorf("completions usage %+v: want the rest of the %d-token context generated", u, contextLen)
	}

	short, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: servertest.SimModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}, ignoreEOS())
	if err != nil {
		t.Fatal(err)
	}
	if short.Usage.CompletionTokens != 1024 {
		t.Errorf("a short prompt generated %d tokens, want the gateway's default cap 1024", short.Usage.CompletionTokens)
	}
}

// ignoreEOS asks the simulated engine for exactly the completion cap in
// force (vLLM's ignore_eos sampling parameter).
func ignoreEOS() option.RequestOption { return option.WithJSONSet("ignore_eos", true) }
