package sidecar

import (
	"context"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tailgate-dev/tailgate/serving/sim"
)

// TestOpenAIClientThroughTheSidecar drives the sidecar with the official
// OpenAI Go SDK: the timing comment must be invisible to an SSE client.
func TestOpenAIClientThroughTheSidecar(t *testing.T) {
	eng := startEngine(t, sim.Config{Model: "m"})
	_, sc := startSidecar(t, eng.srv.URL, nil)
	client := openai.NewClient(option.WithBaseURL(sc.URL+"/v1"), option.WithAPIKey(testToken))
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model:     "m",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there")},
		MaxTokens: openai.Int(8),
	}

	answer, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var streamed strings.Builder
	for stream.Next() {
		for _, c := range stream.Current().Choices {
			streamed.WriteString(c.Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if got, want := streamed.String(), answer.Choices[0].Message.Content; got != want || got == "" {
		t.Errorf("streamed %q, JSON answer %q", got, want)
	}
}

func TestConfigIsValidated(t *testing.T) {
	url := func() string { return "http://127.0.0.1:1" }
	for name, cfg := range map[string]Config{
		"no engine URL":   {ClusterToken: "t"},
		"no token":        {EngineURL: url},
		"negative scrape": {EngineURL: url, ClusterToken: "t", ScrapeInterval: -1},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
