package server_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/option"
	"github.com/tidwall/gjson"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// anthropicClient is Anthropic's Go SDK set up as its docs say, against the
// gateway: the key in x-api-key (option.WithAPIKey), no retries.
func anthropicClient(h *servertest.Gateway, key string) *anthropic.Client {
	c := anthropic.NewClient(option.WithBaseURL(h.Public.URL), option.WithAPIKey(key), option.WithMaxRetries(0))
	return &c
}

// TestAnthropicSDKIsServedAsAnthropicServesIt: Anthropic's own client sends
// its key as x-api-key and reads errors as {"type":"error","error":{…}};
// count_tokens counts what /v1/messages bills as its input and bills no
// token itself.
func TestAnthropicSDKIsServedAsAnthropicServesIt(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	secret := h.Key(policy.KeyOptions{})
	c := anthropicClient(h, secret)
	msgs := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("What is the capital of France?"))}
	system := []anthropic.TextBlockParam{{Text: "Answer briefly."}}

	msg, err := c.Messages.New(t.Context(), anthropic.MessageNewParams{Model: servertest.SimModel, MaxTokens: 16, Messages: msgs, System: system})
	if err != nil || len(msg.Content) == 0 || msg.Usage.InputTokens == 0 {
		t.Fatalf("messages with x-api-key: %v %+v", err, msg)
	}
	count, err := c.Messages.CountTokens(t.Context(), anthropic.MessageCountTokensParams{Model: servertest.SimModel, Messages: msgs,
		System: anthropic.MessageCountTokensParamsSystemUnion{OfTextBlockArray: system}})
	if err != nil || count.InputTokens != msg.Usage.InputTokens {
		t.Fatalf("count_tokens: %v %+v, want the %d input tokens /v1/messages billed", err, count, msg.Usage.InputTokens)
	}

	for _, tc := range []struct {
		name   string
		call   func() error
		status int
		typ    string
	}{
		{"a wrong key", func() error {
			_, err := anthropicClient(h, "tg-wrong").Messages.New(t.Context(), anthropic.MessageNewParams{Model: servertest.SimModel, MaxTokens: 4, Messages: msgs})
			return err
		}, 401, "authentication_error"},
		{"a wrong key on count_tokens", func() error {
			_, err := anthropicClient(h, "tg-wrong").Messages.CountTokens(t.Context(), anthropic.MessageCountTokensParams{Model: servertest.SimModel, Messages: msgs})
			return err
		}, 401, "authentication_error"},
		{"an unknown model", func() error {
			_, err := c.Messages.New(t.Context(), anthropic.MessageNewParams{Model: "claude-nonesuch", MaxTokens: 4, Messages: msgs})
			return err
		}, 404, "not_found_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ae *anthropic.Error
			if err := tc.call(); !errors.As(err, &ae) || ae.StatusCode != tc.status || string(ae.Type()) != tc.typ || ae.RequestID == "" {
				t.Fatalf("got %v, want an anthropic.Error %d %s with a request id", err, tc.status, tc.typ)
			}
		})
	}

	var counted []data.LedgerRow
	for _, row := range h.LedgerRows() {
		if row.Outcome == data.OutcomeOK && row.CompletionTokens == 0 {
			counted = append(counted, row)
		}
	}
	if len(counted) != 1 || counted[0].PromptTokens != 0 || counted[0].Status != 200 {
		t.Fatalf("count_tokens rows: %+v, want one ok row of 0 tokens", counted)
	}
}

// TestMessagesErrorsTakeAnthropicsShape pins the bytes of an error on the
// Messages API (and only there): the type named for the status, the
// request id, Retry-After kept; x-api-key is a key on /v1/messages* alone.
func TestMessagesErrorsTakeAnthropicsShape(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	limited := h.Key(policy.KeyOptions{Tenant: "slow", RPM: 1})
	body := `{"model":"` + servertest.SimModel + `","messages":[{"role":"user","content":"hi"}]}`
	send := func(path, header, key string) (*http.Response, gjson.Result) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, h.Public.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("anthropic-version", "2023-06-01")
		req.Header.Set("anthropic-beta", "token-counting-2024-11-01")
		if header != "" {
			req.Header.Set(header, key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp, gjson.ParseBytes(raw)
	}

	resp, v := send("/v1/messages/count_tokens", "", "")
	if resp.StatusCode != 401 || v.Get("type").Str != "error" || v.Get("error.type").Str != "authentication_error" ||
		!strings.Contains(v.Get("error.message").Str, "x-api-key") || v.Get("request_id").Str != resp.Header.Get("X-Request-Id") {
		t.Fatalf("no key: %d %s", resp.StatusCode, v.Raw)
	}
	if resp, v = send("/v1/messages/count_tokens", "X-Api-Key", limited); resp.StatusCode != 200 || v.Get("input_tokens").Int() == 0 {
		t.Fatalf("count_tokens: %d %s", resp.StatusCode, v.Raw)
	}
	resp, v = send("/v1/messages/count_tokens", "X-Api-Key", limited)
	if resp.StatusCode != 429 || v.Get("error.type").Str != "rate_limit_error" || resp.Header.Get("Retry-After") == "" || v.Get("error.code").Exists() {
		t.Fatalf("over the key's rpm: %d %s Retry-After %q", resp.StatusCode, v.Raw, resp.Header.Get("Retry-After"))
	}
	// Elsewhere, OpenAI's shape, and x-api-key is no key.
	resp, v = send("/v1/chat/completions", "X-Api-Key", limited)
	if resp.StatusCode != 401 || v.Get("error.code").Str != "invalid_api_key" || v.Get("type").Exists() {
		t.Fatalf("x-api-key on chat: %d %s", resp.StatusCode, v.Raw)
	}
}

// TestMessagesStreamBrokenMidwayEndsWithAnthropicsErrorEvent: a Messages
// stream whose replica dies after its first token ends with Anthropic's
// in-band error event ("event: error", {"type":"error","error":{…}}), which
// Anthropic's SDK turns into its error type; OpenAI's unnamed error chunk
// is skipped by that SDK, and the stream looked whole.
func TestMessagesStreamBrokenMidwayEndsWithAnthropicsErrorEvent(t *testing.T) {
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"chatcmpl-1\",\"content\":[],\"model\":\""+
			servertest.SimModel+"\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":9,\"output_tokens\":0}}}\n\n"+
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"content_block\":{\"type\":\"text\",\"text\":\"\"},\"index\":0}\n\n"+
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"half\"},\"index\":0}\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection dies mid-answer
	}))
	t.Cleanup(broken.Close)
	h := servertest.Start(t, servertest.Options{Replicas: 1, Router: router.Config{Selector: prefer("broken")}})
	h.AddReplica("broken", broken.URL, "")
	c := anthropicClient(h, h.Key(policy.KeyOptions{}))

	stream := c.Messages.NewStreaming(t.Context(), anthropic.MessageNewParams{Model: servertest.SimModel, MaxTokens: 16,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	var text strings.Builder
	for stream.Next() {
		if d, ok := stream.Current().AsAny().(anthropic.ContentBlockDeltaEvent); ok {
			text.WriteString(d.Delta.Text)
		}
	}
	var ae *anthropic.Error
	if err := stream.Err(); !errors.As(err, &ae) || string(ae.Type()) != "api_error" || ae.RequestID == "" {
		t.Fatalf("stream ended with %v after %q; want an anthropic.Error api_error with a request id", err, text.String())
	}
	if text.String() != "half" {
		t.Fatalf("text before the error %q, want %q", text.String(), "half")
	}
	if rows := h.LedgerRows(); len(rows) != 1 || rows[0].Outcome != data.OutcomeMidstream {
		t.Fatalf("ledger %+v, want one midstream row", rows)
	}
}

// TestMessagesStreamHeldTooLongIsOverloaded: a Messages stream held for a
// replica that does not come in time (its 200 committed by the progress
// comments) ends with Anthropic's overloaded_error event, which the SDK
// raises as its error type.
func TestMessagesStreamHeldTooLongIsOverloaded(t *testing.T) {
	g, _, key := coldGateway(t, server.HoldConfig{Timeout: 200 * time.Millisecond, Progress: 10 * time.Millisecond})
	stream := anthropicClient(g, key).Messages.NewStreaming(t.Context(), anthropic.MessageNewParams{Model: servertest.SimModel, MaxTokens: 4,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	for stream.Next() {
	}
	var ae *anthropic.Error
	if err := stream.Err(); !errors.As(err, &ae) || string(ae.Type()) != "overloaded_error" || ae.StatusCode != http.StatusOK {
		t.Fatalf("stream ended with %v; want an anthropic.Error overloaded_error on the stream's 200", err)
	}
}
