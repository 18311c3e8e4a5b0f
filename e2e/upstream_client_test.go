package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// TestNetHTTPClientServesAndBillsAsHopDoes: `--upstream-client nethttp`,
// the way back from tailgate's own HTTP/1.1 client to Go's net/http, serves
// a JSON answer and a stream through the real gateway and engine, and the
// ledger bills exactly the tokens the client was told of — the behaviour
// table in serving/hop covers the two clients at the hop; this covers the
// gateway on top of the second one.
func TestNetHTTPClientServesAndBillsAsHopDoes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the tailgate binary")
	}
	for _, client := range []string{"hop", "nethttp"} {
		t.Run(client, func(t *testing.T) {
			simAddr := startSim(t, "--sim-ttft", "1ms", "--sim-tpot", "1ms")
			g := startGateway(t, "--upstream", "http://"+simAddr, "--upstream-client", client)
			deadline := time.Now().Add(15 * time.Second)
			for {
				resp, err := http.Get(strings.TrimSuffix(g.api, "/v1") + "/healthz")
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						break
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("the upstream never became ready; stderr:\n%s", g.stderr.String())
				}
				time.Sleep(50 * time.Millisecond)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c := openai.NewClient(option.WithBaseURL(g.api+"/"), option.WithAPIKey(g.key), option.WithMaxRetries(0))
			params := openai.ChatCompletionNewParams{
				Model:     "tailgate-sim",
				Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")},
				MaxTokens: openai.Int(12),
			}
			whole, err := c.Chat.Completions.New(ctx, params)
			if err != nil {
				t.Fatalf("JSON answer: %v", err)
			}
			if whole.Usage.CompletionTokens == 0 || len(whole.Choices) == 0 || whole.Choices[0].Message.Content == "" {
				t.Fatalf("JSON answer without content or usage: %s", whole.RawJSON())
			}
			params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
			s := c.Chat.Completions.NewStreaming(ctx, params)
			var acc openai.ChatCompletionAccumulator
			for s.Next() {
				acc.AddChunk(s.Current())
			}
			if err := s.Err(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			if acc.Usage.CompletionTokens == 0 || len(acc.Choices) == 0 || acc.Choices[0].Message.Content == "" {
				t.Fatalf("stream without content or usage: %+v", acc.ChatCompletion)
			}

			reqs, pt, ct := usageTotals(t, g.dir)
			wantP := whole.Usage.PromptTokens + acc.Usage.PromptTokens
			wantC := whole.Usage.CompletionTokens + acc.Usage.CompletionTokens
			if reqs != 2 || pt != wantP || ct != wantC {
				t.Fatalf("ledger: %d requests, %d+%d tokens; the client was told of 2 requests, %d+%d", reqs, pt, ct, wantP, wantC)
			}
		})
	}
}
