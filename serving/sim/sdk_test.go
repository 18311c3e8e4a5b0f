package sim

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
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
	if len(page.Data) != 1 || page.Data[0].ID != "sim-model" || page.Data[0].OwnedBy != "tailgate-sim" {
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
