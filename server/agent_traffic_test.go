package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/param"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

func weatherTool() []openai.ChatCompletionToolUnionParam {
	return []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
		Name:       "get_weather",
		Parameters: openai.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}},
	})}
}

// TestAgentTrafficThroughTheGateway: real agent and reasoning traffic from
// the official SDK through the gateway to an engine speaking vLLM's shapes
// — a streamed tool call, n = 2 (JSON and streamed), a reasoning phase
// longer than the TTFT deadline — arrives whole and is billed the engine's
// own usage.
func TestAgentTrafficThroughTheGateway(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1,
		Sim:    sim.Config{Model: servertest.SimModel, TTFT: 5 * time.Millisecond, TPOT: 10 * time.Millisecond, ReasoningTokens: 40},
		Server: server.Config{TTFTDeadline: 200 * time.Millisecond}})
	c := h.Client(h.Key(policy.KeyOptions{}))
	ctx := t.Context()
	user := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Paris?")}

	// A streamed tool call (after 40 reasoning tokens, 400 ms > the 200 ms TTFT deadline).
	st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: servertest.SimModel, Messages: user,
		Tools: weatherTool(), StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: param.NewOpt(true)}})
	var acc openai.ChatCompletionAccumulator
	for st.Next() {
		acc.AddChunk(st.Current())
	}
	if st.Err() != nil {
		t.Fatalf("tool-call stream: %v", st.Err())
	}
	if len(acc.Choices) != 1 || len(acc.Choices[0].Message.ToolCalls) != 1 || acc.Choices[0].Message.ToolCalls[0].Function.Name != "get_weather" ||
		acc.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("tool call not relayed whole: %+v", acc.Choices)
	}
	toolUsage := acc.Usage

	// n = 2, JSON and streamed.
	two, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: servertest.SimModel, Messages: user,
		N: openai.Int(2), MaxTokens: openai.Int(20)})
	if err != nil || len(two.Choices) != 2 {
		t.Fatalf("n=2: %v %+v", err, two)
	}
	st = c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: servertest.SimModel, Messages: user,
		N: openai.Int(2), MaxTokens: openai.Int(20), StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: param.NewOpt(true)}})
	var acc2 openai.ChatCompletionAccumulator
	for st.Next() {
		acc2.AddChunk(st.Current())
	}
	if st.Err() != nil || len(acc2.Choices) != 2 {
		t.Fatalf("n=2 stream: %v %d choices", st.Err(), len(acc2.Choices))
	}

	rows := h.LedgerRows()
	if len(rows) != 3 {
		t.Fatalf("%d ledger rows, want 3", len(rows))
	}
	for i, want := range []openai.CompletionUsage{toolUsage, two.Usage, acc2.Usage} {
		r := rows[i]
		if r.Outcome != data.OutcomeOK || r.PromptTokens != want.PromptTokens || r.CompletionTokens != want.CompletionTokens {
			t.Errorf("row %d: %s billed %d+%d, the engine reported %d+%d", i, r.Outcome, r.PromptTokens, r.CompletionTokens,
				want.PromptTokens, want.CompletionTokens)
		}
	}
	if toolUsage.CompletionTokens < 40 {
		t.Errorf("the reasoning tokens were not billed: %d completion tokens", toolUsage.CompletionTokens)
	}
}

// TestAbortedTwoChoiceStreamBillsEveryChoice: with n = 2 the engine's
// running usage on a chunk counts only that chunk's choice; a stream the
// client abandons is billed the sum over both choices, not the last one.
func TestAbortedTwoChoiceStreamBillsEveryChoice(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1,
		Sim: sim.Config{Model: servertest.SimModel, TTFT: time.Millisecond, TPOT: 5 * time.Millisecond}})
	c := h.Client(h.Key(policy.KeyOptions{}))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: servertest.SimModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("tell me a long story")},
		N:        openai.Int(2), MaxTokens: openai.Int(400)})
	pieces := map[int64]int{}
	for st.Next() {
		for _, ch := range st.Current().Choices {
			if ch.Delta.Content != "" {
				pieces[ch.Index]++
			}
		}
		if pieces[0] >= 15 && pieces[1] >= 15 {
			break
		}
	}
	cancel()
	st.Close()
	if pieces[0] < 15 || pieces[1] < 15 {
		t.Fatalf("got %v pieces", pieces)
	}
	var row data.LedgerRow
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if rows := h.LedgerRows(); len(rows) == 1 {
			row = rows[0]
			break
		}
	}
	got := int64(pieces[0] + pieces[1])
	if row.Outcome != data.OutcomeClientCancelled || row.CompletionTokens < got-2 {
		t.Fatalf("aborted n=2 stream billed %d completion tokens (%s) after the client got %d pieces", row.CompletionTokens, row.Outcome, got)
	}
}
