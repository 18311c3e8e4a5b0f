// Command goclients is the conformance kit's Go row: the official Go SDKs
// (github.com/openai/openai-go/v3, github.com/anthropics/anthropic-sdk-go),
// set up as their docs say, against a running gateway. It prints one JSON
// line per cell, as the kit's Node rows do; scripts/conformance.sh sets its
// environment (TG_BASE, TG_KEY, TG_BIN, TG_DATA).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	aoption "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
)

var (
	base, key, bin, data = os.Getenv("TG_BASE"), os.Getenv("TG_KEY"), os.Getenv("TG_BIN"), os.Getenv("TG_DATA")
	model                = "tailgate-sim"
)

// abortCap is an aborted stream's output cap: far above what it produces
// before the abort.
const abortCap = 400

var features = []string{"plain", "stream", "tools", "structured", "embeddings", "abort", "retry_429", "wrong_model", "wrong_key"}

type check func(ctx context.Context) error

func row(client string, checks map[string]check) {
	// specproxy.mjs tags what follows with this client, for schema.mjs.
	if res, err := http.Post(base+"/_kit/row", "text/plain", strings.NewReader(client)); err == nil {
		res.Body.Close()
	}
	for _, f := range features {
		c, ok := checks[f]
		if !ok {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := c(ctx)
		cancel()
		cell := map[string]any{"client": client, "feature": f, "pass": err == nil}
		if err != nil {
			cell["error"] = err.Error()
		}
		b, _ := json.Marshal(cell)
		fmt.Println(string(b))
	}
}

func newKey(tenant string, flags ...string) string {
	out, err := exec.Command(bin, append([]string{"keys", "create", "--data", data, "--tenant", tenant}, flags...)...).Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "keys create:", err)
		os.Exit(2)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

type totals struct{ Requests, PromptTokens, CompletionTokens int64 }

func usage(tenant string) (totals, error) {
	out, err := exec.Command(bin, "usage", "--data", data, "--tenant", tenant, "--json").Output()
	if err != nil {
		return totals{}, err
	}
	var rows []struct {
		Requests         int64 `json:"requests"`
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	}
	if err := json.Unmarshal(out, &rows); err != nil {
		return totals{}, err
	}
	var t totals
	for _, r := range rows {
		t.Requests += r.Requests
		t.PromptTokens += r.PromptTokens
		t.CompletionTokens += r.CompletionTokens
	}
	return t, nil
}

// checkAbort runs stream on a new tenant's key with a context it cancels
// after three pieces, then checks the ledger billed at least those pieces
// and far less than the cap.
func checkAbort(name string, stream func(ctx context.Context, key string, piece func()) error) check {
	return func(ctx context.Context) error {
		tenant := fmt.Sprintf("abort-%s-%d", name, os.Getpid())
		k := newKey(tenant)
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		pieces := 0
		err := stream(sctx, k, func() {
			if pieces++; pieces == 3 {
				cancel()
			}
		})
		if err != nil && sctx.Err() == nil {
			return err
		}
		if pieces < 3 {
			return fmt.Errorf("only %d pieces before the stream ended", pieces)
		}
		var u totals
		for range 50 {
			if u, err = usage(tenant); err == nil && u.Requests > 0 && u.CompletionTokens > 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if u.CompletionTokens < 3 || u.CompletionTokens >= abortCap {
			return fmt.Errorf("billed %+v after 3 pieces of a %d-token cap", u, abortCap)
		}
		return nil
	}
}

// recorder records the statuses a client saw (a middleware of both SDKs).
type recorder struct {
	mu       sync.Mutex
	statuses []int
}

func (r *recorder) middleware(req *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	resp, err := next(req)
	if resp != nil {
		r.mu.Lock()
		r.statuses = append(r.statuses, resp.StatusCode)
		r.mu.Unlock()
	}
	return resp, err
}

// checkRetried holds the key's one concurrency slot with a short stream
// while call runs: the client must see a 429 and succeed after it.
func checkRetried(concKey string, rec *recorder, call func(ctx context.Context) error) check {
	return func(ctx context.Context) error {
		body := `{"model":"` + model + `","stream":true,"max_tokens":40,"messages":[{"role":"user","content":"hold"}]}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+concKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		if resp.StatusCode != 200 {
			resp.Body.Close()
			return fmt.Errorf("holder: %d", resp.StatusCode)
		}
		buf := make([]byte, 1)
		_, _ = resp.Body.Read(buf) // admitted
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer resp.Body.Close()
			b := make([]byte, 4096)
			for {
				if _, err := resp.Body.Read(b); err != nil {
					return
				}
			}
		}()
		err = call(ctx)
		<-done
		if err != nil {
			return err
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		i := slices.Index(rec.statuses, 429)
		if i < 0 || !slices.Contains(rec.statuses[i:], 200) {
			return fmt.Errorf("statuses %v: want a 429, then a success", rec.statuses)
		}
		return nil
	}
}

func expect(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf(format, args...)
}

var weatherSchema = map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}, "days": map[string]any{"type": "integer"}},
	"required": []string{"city", "days"}, "additionalProperties": false}

type person struct {
	Name *string `json:"name"`
	Age  *int    `json:"age"`
}

func isPerson(raw string) error {
	var p person
	if err := json.Unmarshal([]byte(raw), &p); err != nil || p.Name == nil || p.Age == nil {
		return fmt.Errorf("not a person: %s (%v)", raw, err)
	}
	return nil
}

var personSchema = map[string]any{"type": "object", "properties": map[string]any{"name": map[string]any{"type": "string"}, "age": map[string]any{"type": "integer"}},
	"required": []string{"name", "age"}, "additionalProperties": false}

func openaiRow(concKey string) {
	mk := func(k string, opts ...option.RequestOption) *openai.Client {
		c := openai.NewClient(append([]option.RequestOption{option.WithBaseURL(base + "/v1"), option.WithAPIKey(k)}, opts...)...)
		return &c
	}
	c := mk(key)
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Paris?")}
	rec := &recorder{}
	row("openai-go/v3", map[string]check{
		"plain": func(ctx context.Context) error {
			r, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs, MaxTokens: openai.Int(16)})
			if err != nil {
				return err
			}
			return expect(r.Choices[0].Message.Content != "" && r.Usage.CompletionTokens > 0, "no answer: %+v", r)
		},
		"stream": func(ctx context.Context) error {
			s := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs, MaxTokens: openai.Int(16),
				StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
			var text string
			var out int64
			for s.Next() {
				ch := s.Current()
				if len(ch.Choices) > 0 {
					text += ch.Choices[0].Delta.Content
				}
				out = max(out, ch.Usage.CompletionTokens)
			}
			if s.Err() != nil {
				return s.Err()
			}
			return expect(text != "" && out > 0, "stream %q usage %d", text, out)
		},
		"tools": func(ctx context.Context) error {
			r, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs,
				Tools:      []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "get_weather", Parameters: weatherSchema})},
				ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}})
			if err != nil {
				return err
			}
			calls := r.Choices[0].Message.ToolCalls
			var args struct{ City *string }
			if len(calls) == 0 || json.Unmarshal([]byte(calls[0].Function.Arguments), &args) != nil || args.City == nil {
				return fmt.Errorf("no tool call: %+v", r.Choices[0].Message)
			}
			return nil
		},
		"structured": func(ctx context.Context) error {
			r, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs,
				ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
					JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "person", Strict: openai.Bool(true), Schema: personSchema}}}})
			if err != nil {
				return err
			}
			return isPerson(r.Choices[0].Message.Content)
		},
		"embeddings": func(ctx context.Context) error {
			r, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: model, Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("hello")}})
			if err != nil {
				return err
			}
			return expect(len(r.Data) == 1 && len(r.Data[0].Embedding) > 0, "no embedding")
		},
		"abort": checkAbort("openai-go", func(ctx context.Context, k string, piece func()) error {
			s := mk(k).Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs, MaxTokens: openai.Int(abortCap)})
			for s.Next() {
				if ch := s.Current(); len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
					piece()
				}
			}
			return s.Err()
		}),
		"retry_429": checkRetried(concKey, rec, func(ctx context.Context) error {
			_, err := mk(concKey, option.WithMiddleware(rec.middleware)).Chat.Completions.New(ctx,
				openai.ChatCompletionNewParams{Model: model, Messages: msgs, MaxTokens: openai.Int(4)})
			return err
		}),
		"wrong_model": func(ctx context.Context) error {
			_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "no-such-model", Messages: msgs}, option.WithMaxRetries(0))
			var e *openai.Error
			return expect(errors.As(err, &e) && e.StatusCode == 404 && strings.Contains(e.Message, "no-such-model"), "got %v", err)
		},
		"wrong_key": func(ctx context.Context) error {
			_, err := mk("tg-wrong", option.WithMaxRetries(0)).Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs})
			var e *openai.Error
			return expect(errors.As(err, &e) && e.StatusCode == 401 && e.Code == "invalid_api_key", "got %v", err)
		},
	})
}

func anthropicRow(concKey string) {
	mk := func(k string, opts ...aoption.RequestOption) *anthropic.Client {
		c := anthropic.NewClient(append([]aoption.RequestOption{aoption.WithBaseURL(base), aoption.WithAPIKey(k)}, opts...)...)
		return &c
	}
	c := mk(key)
	msgs := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("What is the weather in Paris?"))}
	toolCall := func(ctx context.Context, name string, schema map[string]any, choice anthropic.ToolChoiceUnionParam) (anthropic.ToolUseBlock, error) {
		m, err := c.Messages.New(ctx, anthropic.MessageNewParams{Model: model, MaxTokens: 256, Messages: msgs,
			Tools:      []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{Name: name, InputSchema: anthropic.ToolInputSchemaParam{Properties: schema["properties"], Required: schema["required"].([]string)}}}},
			ToolChoice: choice})
		if err != nil {
			return anthropic.ToolUseBlock{}, err
		}
		for _, b := range m.Content {
			if b.Type == "tool_use" {
				return b.AsToolUse(), nil
			}
		}
		return anthropic.ToolUseBlock{}, fmt.Errorf("no tool_use block: %s", m.RawJSON())
	}
	rec := &recorder{}
	row("anthropic-sdk-go", map[string]check{
		"plain": func(ctx context.Context) error {
			m, err := c.Messages.New(ctx, anthropic.MessageNewParams{Model: model, MaxTokens: 16, Messages: msgs})
			if err != nil {
				return err
			}
			n, err := c.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{Model: model, Messages: msgs})
			if err != nil {
				return err
			}
			return expect(len(m.Content) > 0 && m.Usage.OutputTokens > 0 && n.InputTokens == m.Usage.InputTokens,
				"messages %s; count_tokens %d", m.RawJSON(), n.InputTokens)
		},
		"stream": func(ctx context.Context) error {
			s := c.Messages.NewStreaming(ctx, anthropic.MessageNewParams{Model: model, MaxTokens: 16, Messages: msgs})
			var m anthropic.Message
			for s.Next() {
				if err := m.Accumulate(s.Current()); err != nil {
					return err
				}
			}
			if s.Err() != nil {
				return s.Err()
			}
			return expect(len(m.Content) > 0 && m.Content[0].Text != "" && m.Usage.OutputTokens > 0, "stream %s", m.RawJSON())
		},
		"tools": func(ctx context.Context) error {
			t, err := toolCall(ctx, "get_weather", weatherSchema, anthropic.ToolChoiceUnionParam{OfAny: &anthropic.ToolChoiceAnyParam{}})
			if err != nil {
				return err
			}
			var args struct{ City *string }
			return expect(t.Name == "get_weather" && json.Unmarshal(t.Input, &args) == nil && args.City != nil, "tool call %s", t.RawJSON())
		},
		"structured": func(ctx context.Context) error {
			t, err := toolCall(ctx, "person", personSchema, anthropic.ToolChoiceParamOfTool("person"))
			if err != nil {
				return err
			}
			return isPerson(string(t.Input))
		},
		"abort": checkAbort("anthropic-sdk-go", func(ctx context.Context, k string, piece func()) error {
			s := mk(k).Messages.NewStreaming(ctx, anthropic.MessageNewParams{Model: model, MaxTokens: abortCap, Messages: msgs})
			for s.Next() {
				if s.Current().Type == "content_block_delta" {
					piece()
				}
			}
			return s.Err()
		}),
		"retry_429": checkRetried(concKey, rec, func(ctx context.Context) error {
			_, err := mk(concKey, aoption.WithMiddleware(rec.middleware)).Messages.New(ctx, anthropic.MessageNewParams{Model: model, MaxTokens: 4, Messages: msgs})
			return err
		}),
		"wrong_model": func(ctx context.Context) error {
			_, err := c.Messages.New(ctx, anthropic.MessageNewParams{Model: "no-such-model", MaxTokens: 4, Messages: msgs}, aoption.WithMaxRetries(0))
			var e *anthropic.Error
			return expect(errors.As(err, &e) && e.StatusCode == 404 && e.Type() == "not_found_error", "got %v", err)
		},
		"wrong_key": func(ctx context.Context) error {
			_, err := mk("tg-wrong", aoption.WithMaxRetries(0)).Messages.New(ctx, anthropic.MessageNewParams{Model: model, MaxTokens: 4, Messages: msgs})
			var e *anthropic.Error
			return expect(errors.As(err, &e) && e.StatusCode == 401 && e.Type() == "authentication_error", "got %v", err)
		},
	})
}

func main() {
	if base == "" || key == "" || bin == "" || data == "" {
		fmt.Fprintln(os.Stderr, "goclients: TG_BASE, TG_KEY, TG_BIN and TG_DATA must be set (run scripts/conformance.sh)")
		os.Exit(2)
	}
	openaiRow(newKey(fmt.Sprintf("conc-openai-go-%d", os.Getpid()), "--max-concurrency", "1"))
	anthropicRow(newKey(fmt.Sprintf("conc-anthropic-go-%d", os.Getpid()), "--max-concurrency", "1"))
}
