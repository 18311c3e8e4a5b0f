package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// cutProxy forwards loopback TCP connections to target; the first cut
// connections are closed as soon as the answer's first byte comes back,
// before the client gets any of it: the engine has answered, the client
// sees its connection drop.
func cutProxy(t *testing.T, target string, cut int32) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c) }()
				if n.Add(1) <= cut {
					var b [1]byte
					_, _ = u.Read(b[:]) // the answer starts: drop both sides
					return
				}
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	return ln.Addr().String()
}

// billedRows returns the rows that bill something, and the replays.
func billedRows(rows []data.LedgerRow) (billed, replays []data.LedgerRow) {
	for _, r := range rows {
		switch {
		case r.ReplayOf != "":
			replays = append(replays, r)
		case r.PromptTokens+r.CompletionTokens > 0:
			billed = append(billed, r)
		}
	}
	return billed, replays
}

func completed(h *servertest.Gateway) (n int64) {
	for _, e := range h.Engines {
		n += e.Stats().Completed
	}
	return n
}

// The OpenAI SDK's own retry of a JSON request whose connection was cut
// after the engine answered gets the recorded answer: the same completion
// id and content, billed once, the engine run once.
func TestIdempotencySDKRetryAfterCutIsBilledOnce(t *testing.T) {
	h := servertest.Start(t, servertest.Options{})
	key := h.Key(policy.KeyOptions{})
	addr := cutProxy(t, strings.TrimPrefix(h.Public.URL, "http://"), 1)
	client := openai.NewClient(option.WithBaseURL("http://"+addr+"/v1"), option.WithAPIKey(key),
		option.WithMaxRetries(2), option.WithHeader("Idempotency-Key", "order-42"))
	var resp *http.Response
	params := openai.ChatCompletionNewParams{
		Model: servertest.SimModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("bill me once")}, MaxTokens: openai.Int(12),
	}
	chat, err := client.Chat.Completions.New(context.Background(), params, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("Idempotent-Replayed") != "true" || resp.Header.Get("X-Tailgate-Replay-Of") == "" {
		t.Fatalf("the SDK's retry was not a replay: headers %v", resp.Header)
	}
	if got := completed(h); got != 1 {
		t.Fatalf("the engines completed %d generations, want 1", got)
	}
	// A later retry, straight to the gateway, gets the same answer again.
	direct := h.Client(key, option.WithHeader("Idempotency-Key", "order-42"))
	again, err := direct.Chat.Completions.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != chat.ID || again.Choices[0].Message.Content != chat.Choices[0].Message.Content || chat.ID == "" {
		t.Fatalf("replay %q %q, first %q %q", again.ID, again.Choices[0].Message.Content, chat.ID, chat.Choices[0].Message.Content)
	}
	billed, replays := billedRows(h.LedgerRows())
	if len(billed) != 1 || len(replays) != 2 {
		t.Fatalf("%d billed rows and %d replays, want 1 and 2: %+v", len(billed), len(replays), h.LedgerRows())
	}
	for _, r := range replays {
		if r.ReplayOf != billed[0].ID || r.CostMicros != 0 || r.PromptTokens+r.CompletionTokens != 0 || r.Outcome != data.OutcomeOK || r.Model != servertest.SimModel {
			t.Fatalf("replay row %+v, original %s", r, billed[0].ID)
		}
	}
	if billed[0].CompletionTokens != chat.Usage.CompletionTokens {
		t.Fatalf("billed %d completion tokens, the answer says %d", billed[0].CompletionTokens, chat.Usage.CompletionTokens)
	}
}

// The same key with another body is refused with 422 naming the conflict;
// nothing runs.
func TestIdempotencyKeyReusedForAnotherBodyIs422(t *testing.T) {
	h := servertest.Start(t, servertest.Options{})
	key := h.Key(policy.KeyOptions{})
	send := func(body string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, h.Public.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Idempotency-Key", "k-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	if r := send(`{"model":"tailgate-sim","messages":[{"role":"user","content":"a"}],"max_tokens":3}`); r.StatusCode != 200 {
		t.Fatalf("first: %d", r.StatusCode)
	}
	r := send(`{"model":"tailgate-sim","messages":[{"role":"user","content":"b"}],"max_tokens":3}`)
	var e struct {
		Error struct{ Code, Param, Type string }
	}
	_ = json.NewDecoder(r.Body).Decode(&e)
	if r.StatusCode != http.StatusUnprocessableEntity || e.Error.Code != "idempotency_key_reused" || e.Error.Param != "Idempotency-Key" {
		t.Fatalf("reused key: %d %+v", r.StatusCode, e)
	}
	if got := completed(h); got != 1 {
		t.Fatalf("the engines completed %d generations, want 1", got)
	}
	// Another tenant's same key is its own.
	other := h.Key(policy.KeyOptions{Tenant: "globex"})
	c := h.Client(other, option.WithHeader("Idempotency-Key", "k-1"))
	if _, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: servertest.SimModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("b")}, MaxTokens: openai.Int(3),
	}); err != nil {
		t.Fatalf("another tenant's key: %v", err)
	}
}

// A retry that arrives while the first request still runs waits for its
// answer: the engine runs once, both get the same completion.
func TestIdempotencyConcurrentRetryWaits(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1, Sim: sim.Config{TPOT: 40 * time.Millisecond}})
	key := h.Key(policy.KeyOptions{})
	c := h.Client(key, option.WithHeader("Idempotency-Key", "same"))
	params := openai.ChatCompletionNewParams{
		Model: servertest.SimModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("a slow answer")}, MaxTokens: openai.Int(40),
	}
	var wg sync.WaitGroup
	var first *openai.ChatCompletion
	var firstErr error
	wg.Go(func() { first, firstErr = c.Chat.Completions.New(context.Background(), params) })
	testkit.WaitWithin(t, 10*time.Second, "the first request generating", func() bool { return h.Engines[0].Stats().Running == 1 })
	var resp *http.Response
	second, err := c.Chat.Completions.New(context.Background(), params, option.WithResponseInto(&resp))
	wg.Wait()
	if err != nil || firstErr != nil {
		t.Fatal(err, firstErr)
	}
	if h.Engines[0].Stats().Completed != 1 {
		t.Fatalf("the engine completed %d generations, want 1", h.Engines[0].Stats().Completed)
	}
	if second.ID != first.ID || second.Choices[0].Message.Content != first.Choices[0].Message.Content || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("second %q, first %q, replayed %q", second.ID, first.ID, resp.Header.Get("Idempotent-Replayed"))
	}
	billed, replays := billedRows(h.LedgerRows())
	if len(billed) != 1 || len(replays) != 1 {
		t.Fatalf("%d billed rows and %d replays, want 1 and 1", len(billed), len(replays))
	}
}
