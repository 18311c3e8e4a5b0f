package server_test

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/tidwall/gjson"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// TestAbortedStreamIsBilledFromTheEnginesCount: the gateway asks the engine
// for usage on every chunk (continuous_usage_stats), so a stream the client
// abandons is billed the engine's exact prompt and the completion tokens it
// had produced — not a bytes/4 estimate — while a client that did not ask
// for usage never sees a usage field.
func TestAbortedStreamIsBilledFromTheEnginesCount(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1,
		Sim: sim.Config{Model: servertest.SimModel, TTFT: time.Millisecond, TPOT: 5 * time.Millisecond}})
	secret := h.Key(policy.KeyOptions{})
	prompt := strings.Repeat("a fairly long prompt with many words in it ", 40)

	// A whole answer tells the engine's prompt count.
	c := h.Client(secret)
	full, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: servertest.SimModel,
		MaxTokens: openai.Int(3), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}})
	if err != nil {
		t.Fatal(err)
	}
	want := full.Usage.PromptTokens

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	body := `{"model":"` + servertest.SimModel + `","stream":true,"max_tokens":500,"ignore_eos":true,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.Public.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+secret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	events := 0
	for sc.Scan() && events < 10 {
		line := sc.Text()
		if strings.HasPrefix(line, "data: ") {
			if strings.Contains(line, `"usage"`) {
				t.Fatalf("usage reached a client that did not ask for it: %s", line)
			}
			events++
		}
	}
	cancel()
	resp.Body.Close()

	var row data.LedgerRow
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if rows := h.LedgerRows(); len(rows) == 2 {
			row = rows[1]
			if rows[0].Stream {
				row = rows[0]
			}
			break
		}
	}
	if row.Outcome != data.OutcomeClientCancelled {
		t.Fatalf("row %+v", row)
	}
	if row.PromptTokens != want {
		t.Fatalf("aborted stream billed %d prompt tokens, the engine counted %d", row.PromptTokens, want)
	}
	if row.CompletionTokens < int64(events-1) || row.CompletionTokens >= 500 {
		t.Fatalf("aborted stream billed %d completion tokens after %d events", row.CompletionTokens, events)
	}
}

// TestMultiTokenChunksAreBilledFromUsage: vLLM may put several tokens in one
// chunk (--stream-interval, output merging) and counts an EOS that carries
// no text, so a stream's events are not its tokens. A whole stream and one
// the client abandons are both billed the engine's own count, never the
// events the client received.
func TestMultiTokenChunksAreBilledFromUsage(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1,
		Sim: sim.Config{Model: servertest.SimModel, TTFT: time.Millisecond, TPOT: 2 * time.Millisecond, StreamInterval: 4}})
	secret := h.Key(policy.KeyOptions{})

	stream := func(ctx context.Context, maxTokens, stopAfter int) (events int, lastUsage int64) {
		body := `{"model":"` + servertest.SimModel + `","stream":true,"max_tokens":` + strconv.Itoa(maxTokens) +
			`,"ignore_eos":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"messages":[{"role":"user","content":"count"}]}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.Public.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() && (stopAfter == 0 || events < stopAfter) {
			payload, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || payload == "[DONE]" {
				continue
			}
			if c := gjson.Get(payload, "choices.0.delta.content"); c.Exists() && c.Str != "" {
				events++
			}
			if u := gjson.Get(payload, "usage.completion_tokens"); u.Exists() {
				lastUsage = u.Int()
			}
		}
		return events, lastUsage
	}

	events, usage := stream(t.Context(), 40, 0)
	if usage != 40 || events >= 40 {
		t.Fatalf("engine sent %d content events for %d tokens; the test needs multi-token chunks", events, usage)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cutEvents, cutUsage := stream(ctx, 400, 5)
	cancel()

	rows := h.LedgerRows()
	for deadline := time.Now().Add(5 * time.Second); len(rows) < 2 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		rows = h.LedgerRows()
	}
	if len(rows) != 2 {
		t.Fatalf("ledger %+v, want two rows", rows)
	}
	whole, cut := rows[0], rows[1]
	if whole.Outcome == data.OutcomeClientCancelled {
		whole, cut = cut, whole
	}
	if whole.CompletionTokens != 40 {
		t.Errorf("whole stream billed %d completion tokens, the engine counted 40 (in %d events)", whole.CompletionTokens, events)
	}
	if cut.Outcome != data.OutcomeClientCancelled || cut.CompletionTokens < cutUsage || cut.CompletionTokens >= 400 {
		t.Errorf("abandoned stream: %s billed %d completion tokens; the client had seen %d events and the engine's count %d",
			cut.Outcome, cut.CompletionTokens, cutEvents, cutUsage)
	}
	if cut.CompletionTokens <= int64(cutEvents) {
		t.Errorf("abandoned stream billed %d completion tokens for %d multi-token events: counted events, not tokens", cut.CompletionTokens, cutEvents)
	}
}
