package sim

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"
)

// TestOpenAIClient drives the engine with the official OpenAI Go SDK, the
// way tailgate's users' code talks to a server.
func TestOpenAIClient(t *testing.T) {
	_, srv := start(t, Config{Model: "sim-model"})
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("x"))
	ctx := context.Background()

	page, err := client.Models.List(ctx)
	if err != nil {
		t.Fatalf("list models: %v", err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != "sim-model" || page.Data[0].OwnedBy != "vllm" {
		t.Errorf("models = %+v", page.Data)
	}

	params := openai.ChatCompletionNewParams{
		Model:     "sim-model",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
		MaxTokens: openai.Int(7),
	}
	answer, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	if answer.Usage.PromptTokens != 9 || answer.Usage.CompletionTokens != 7 || answer.Usage.TotalTokens != 16 {
		t.Errorf("usage = %+v", answer.Usage)
	}
	if len(answer.Choices) != 1 || answer.Choices[0].FinishReason != "length" ||
		len(strings.Fields(answer.Choices[0].Message.Content)) != 7 {
		t.Errorf("choices = %+v", answer.Choices)
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var content strings.Builder
	var final openai.ChatCompletionChunk
	chunks := 0
	for stream.Next() {
		chunks++
		final = stream.Current()
		for _, c := range final.Choices {
			content.WriteString(c.Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if chunks != 1+7+1 {
		t.Errorf("%d chunks, want role + 7 tokens + usage", chunks)
	}
	if len(final.Choices) != 0 || final.Usage.PromptTokens != 9 || final.Usage.CompletionTokens != 7 {
		t.Errorf("final chunk = %+v", final)
	}
	if content.String() != answer.Choices[0].Message.Content {
		t.Errorf("streamed %q, answered %q", content.String(), answer.Choices[0].Message.Content)
	}

	params.Model = "other"
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{} // vLLM refuses stream_options without stream
	_, err = client.Chat.Completions.New(ctx, params)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Type != "NotFoundError" {
		t.Errorf("unknown model error = %v", err)
	}
}

// TestOpenAIClientAgentTraffic drives tool calls, a reasoning phase, n
// choices, embeddings and the Responses API with the official SDK.
func TestOpenAIClientAgentTraffic(t *testing.T) {
	_, srv := start(t, Config{Model: "sim-model", ReasoningTokens: 2})
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("x"))
	ctx := context.Background()

	weather := openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
		Name: "get_weather",
		Parameters: shared.FunctionParameters{
			"type":       "object",
			"properties": map[string]any{"city": map[string]any{"type": "string"}},
		},
	})
	params := openai.ChatCompletionNewParams{
		Model:    "sim-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("weather in Paris?")},
		Tools:    []openai.ChatCompletionToolUnionParam{weather},
	}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	var finished []openai.FinishedChatCompletionToolCall
	for stream.Next() {
		acc.AddChunk(stream.Current())
		if tc, ok := acc.JustFinishedToolCall(); ok {
			finished = append(finished, tc)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if len(acc.Choices) != 1 || acc.Choices[0].FinishReason != "tool_calls" || len(acc.Choices[0].Message.ToolCalls) != 1 {
		t.Fatalf("accumulated %+v", acc.Choices)
	}
	call := acc.Choices[0].Message.ToolCalls[0]
	var args struct{ City string }
	if call.Function.Name != "get_weather" || json.Unmarshal([]byte(call.Function.Arguments), &args) != nil || args.City == "" {
		t.Errorf("tool call %+v", call)
	}
	if len(finished) != 1 || finished[0].ID != call.ID || finished[0].Arguments != call.Function.Arguments {
		t.Errorf("JustFinishedToolCall = %+v, want the call", finished)
	}
	if acc.Usage.CompletionTokens != 0 {
		t.Errorf("usage without include_usage: %+v", acc.Usage)
	}

	params.Tools = nil
	params.N = openai.Int(2)
	answer, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("n=2: %v", err)
	}
	if len(answer.Choices) != 2 || answer.Choices[1].Index != 1 || answer.Choices[0].Message.Content == answer.Choices[1].Message.Content {
		t.Errorf("choices = %+v", answer.Choices)
	}
	if answer.Usage.CompletionTokensDetails.ReasoningTokens != 4 || !strings.Contains(answer.Choices[0].Message.RawJSON(), `"refusal":null`) {
		t.Errorf("usage %+v, message %s", answer.Usage, answer.Choices[0].Message.RawJSON())
	}

	emb, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: "sim-model",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a", "bb"}},
	})
	if err != nil {
		t.Fatalf("embeddings: %v", err)
	}
	if len(emb.Data) != 2 || len(emb.Data[1].Embedding) != defaultEmbedDim || emb.Usage.PromptTokens != 4 || emb.Usage.TotalTokens != 4 {
		t.Errorf("embeddings = %d vectors, usage %+v", len(emb.Data), emb.Usage)
	}

	rparams := responses.ResponseNewParams{
		Model: "sim-model",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")},
	}
	resp, err := client.Responses.New(ctx, rparams)
	if err != nil {
		t.Fatalf("responses: %v", err)
	}
	if resp.Status != "completed" || resp.OutputText() == "" || resp.Usage.OutputTokensDetails.ReasoningTokens != 2 ||
		resp.Usage.InputTokens != int64(ChatPromptTokens("hello")) || resp.Usage.TotalTokens != resp.Usage.InputTokens+resp.Usage.OutputTokens {
		t.Errorf("response %s", resp.RawJSON())
	}
	rs := client.Responses.NewStreaming(ctx, rparams)
	var text strings.Builder
	var done responses.Response
	seq := int64(0)
	for rs.Next() {
		ev := rs.Current()
		if ev.SequenceNumber != seq {
			t.Errorf("event %q has sequence_number %d, want %d", ev.Type, ev.SequenceNumber, seq)
		}
		seq++
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.completed":
			done = ev.Response
		}
	}
	if err := rs.Err(); err != nil {
		t.Fatalf("responses stream: %v", err)
	}
	if text.String() != resp.OutputText() || done.OutputText() != resp.OutputText() || done.Usage.OutputTokens != resp.Usage.OutputTokens {
		t.Errorf("streamed %q (completed: %q), answered %q", text.String(), done.OutputText(), resp.OutputText())
	}
}
