package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

func TestSDKListChatStreamAndCompletions(t *testing.T) {
	h := servertest.Start(t, servertest.Options{})
	client := h.Client(h.Key(policy.KeyOptions{}))
	ctx := context.Background()

	models, err := client.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(models.Data) != 1 || models.Data[0].ID != servertest.SimModel {
		t.Fatalf("models = %+v, want [%s]", models.Data, servertest.SimModel)
	}

	prompt := "Tell me about tail latency."
	chat, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:     servertest.SimModel,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
		MaxTokens: openai.Int(7),
	})
	if err != nil {
		t.Fatal(err)
	}
	wantPrompt := int64(sim.ChatPromptTokens(prompt))
	wantCompletion := int64(sim.CompletionTokens(7, 0, false, prompt))
	if chat.Usage.PromptTokens != wantPrompt || chat.Usage.CompletionTokens != wantCompletion || chat.Choices[0].Message.Content == "" {
		t.Fatalf("chat usage = %+v content %q; want prompt %d completion %d", chat.Usage, chat.Choices[0].Message.Content, wantPrompt, wantCompletion)
	}

	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:         servertest.SimModel,
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
		MaxTokens:     openai.Int(9),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	wantCompletion = int64(sim.CompletionTokens(9, 0, false, prompt))
	if acc.Usage.PromptTokens != wantPrompt || acc.Usage.CompletionTokens != wantCompletion {
		t.Fatalf("stream usage = %+v; want %d/%d", acc.Usage, wantPrompt, wantCompletion)
	}
	if got := len(strings.Fields(acc.Choices[0].Message.Content)); int64(got) != wantCompletion {
		t.Fatalf("streamed %d words, usage says %d", got, wantCompletion)
	}

	comp, err := client.Completions.New(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(servertest.SimModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
		MaxTokens: openai.Int(4),
	})
	if err != nil {
		t.Fatal(err)
	}
	if comp.Usage.PromptTokens != int64(sim.TextPromptTokens("Once upon a time")) || comp.Usage.CompletionTokens == 0 {
		t.Fatalf("completion usage = %+v", comp.Usage)
	}

	rows := h.LedgerRows()
	if len(rows) != 3 {
		t.Fatalf("ledger has %d rows, want 3", len(rows))
	}
	for _, r := range rows {
		if r.Status != 200 || r.Outcome != "ok" || r.Upstream == "" || r.Stages.Gateway < 0 || r.Stages.TTFT < 0 || r.Stages.Total < r.Stages.TTFT {
			t.Fatalf("ledger row %+v", r)
		}
	}
}

// readSSE returns the data payloads of an SSE body.
func readSSE(t *testing.T, r io.Reader) (payloads []string, comments int) {
	t.Helper()
	raw, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range strings.Split(string(raw), "\n\n") {
		switch {
		case strings.HasPrefix(ev, "data: "):
			payloads = append(payloads, strings.TrimPrefix(ev, "data: "))
		case strings.HasPrefix(ev, ":"):
			comments++
		}
	}
	return payloads, comments
}

func TestStreamUsageChunkOnlyWhenAsked(t *testing.T) {
	h := servertest.Start(t, servertest.Options{})
	secret := h.Key(policy.KeyOptions{})
	for _, tc := range []struct {
		name      string
		opts      string
		wantUsage bool
	}{
		{"not asked", ``, false},
		{"asked", `,"stream_options":{"include_usage":true}`, true},
		{"asked false", `,"stream_options":{"include_usage":false}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.Post("/v1/chat/completions", secret,
				`{"model":"tailgate-sim","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]`+tc.opts+`}`)
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Fatalf("content-type %q", ct)
			}
			payloads, _ := readSSE(t, resp.Body)
			if payloads[len(payloads)-1] != "[DONE]" {
				t.Fatalf("last event %q, want [DONE]", payloads[len(payloads)-1])
			}
			sawUsage, usageOnly := false, false
			for _, p := range payloads {
				if strings.Contains(p, `"usage":{`) {
					sawUsage = true
				}
				if strings.Contains(p, `"choices":[]`) {
					usageOnly = true
				}
			}
			if usageOnly != tc.wantUsage {
				t.Fatalf("usage-only chunk (choices []) present = %v, want %v: it exists only when asked for", usageOnly, tc.wantUsage)
			}
			if sawUsage != tc.wantUsage {
				t.Fatalf("usage chunk present = %v, want %v:\n%s", sawUsage, tc.wantUsage, strings.Join(payloads, "\n"))
			}
		})
	}
	// Billing knew the usage every time.
	for _, r := range h.LedgerRows() {
		if r.PromptTokens != int64(sim.ChatPromptTokens("hi")) || r.CompletionTokens != 3 {
			t.Fatalf("ledger row usage %d/%d, want %d/3", r.PromptTokens, r.CompletionTokens, sim.ChatPromptTokens("hi"))
		}
	}
}

func TestResponseHeaders(t *testing.T) {
	h := servertest.Start(t, servertest.Options{})
	secret := h.Key(policy.KeyOptions{RPM: 100, TPM: 100000})
	resp := h.Post("/v1/chat/completions", secret, `{"model":"tailgate-sim","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	st := resp.Header.Get("Server-Timing")
	for _, stage := range []string{"gateway;dur=", "connect;dur=", "upstream_ttft;dur=", "ttft;dur=", "total;dur="} {
		if !strings.Contains(st, stage) {
			t.Errorf("Server-Timing %q lacks %s", st, stage)
		}
	}
	for _, hd := range []string{"X-Request-Id", "X-Tailgate-Replica", "X-Tailgate-Attempts",
		"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
		"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens"} {
		if resp.Header.Get(hd) == "" {
			t.Errorf("missing header %s", hd)
		}
	}
	if got := resp.Header.Get("X-Ratelimit-Remaining-Requests"); got != "99" {
		t.Errorf("remaining requests %q, want 99", got)
	}
	rows := h.LedgerRows()
	if len(rows) != 1 || rows[0].ID != resp.Header.Get("X-Request-Id") || rows[0].Upstream != resp.Header.Get("X-Tailgate-Replica") {
		t.Fatalf("ledger row does not match headers: %+v", rows)
	}
}

func TestHealthz(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	get := func() int {
		resp, err := http.Get(h.Public.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get(); got != 200 {
		t.Fatalf("healthz with a ready replica = %d", got)
	}
	h.Reg.Replicas()[0].SetState(3, "draining") // StateDraining
	if got := get(); got != 503 {
		t.Fatalf("healthz with no ready replica = %d", got)
	}
}

func decodeError(t *testing.T, resp *http.Response) (code, typ, param string) {
	t.Helper()
	var body struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    string  `json:"code"`
		} `json:"error"`
	}
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &body); err != nil || body.Error.Message == "" {
		t.Fatalf("not an OpenAI error body: %s", raw)
	}
	if strings.Contains(string(raw), "goroutine") || strings.Contains(string(raw), ".go:") {
		t.Fatalf("error body leaks internals: %s", raw)
	}
	p := ""
	if body.Error.Param != nil {
		p = *body.Error.Param
	}
	return body.Error.Code, body.Error.Type, p
}

var _ = option.WithHeader
