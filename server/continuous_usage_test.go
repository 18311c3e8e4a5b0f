package server_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"tailgate/data"
	"tailgate/policy"
	"tailgate/server/internal/servertest"
	"tailgate/serving/sim"
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
