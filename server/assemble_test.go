package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/tidwall/gjson"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// flatJSON lists a JSON document's leaves in document order as
// "path=value" (strings decoded, so escaping style does not matter; key
// order does), leaving out the paths skip says to.
func flatJSON(raw string, skip func(path string) bool) []string {
	var out []string
	var walk func(path string, v gjson.Result)
	walk = func(path string, v gjson.Result) {
		if skip != nil && skip(path) {
			return
		}
		switch {
		case v.IsObject() || v.IsArray():
			n := 0
			v.ForEach(func(k, e gjson.Result) bool {
				key := k.String()
				if v.IsArray() {
					key = fmt.Sprint(n)
				}
				n++
				walk(strings.TrimPrefix(path+"."+key, "."), e)
				return true
			})
			if n == 0 {
				out = append(out, path+"="+v.Raw)
			}
		case v.Type == gjson.String:
			out = append(out, path+"="+fmt.Sprintf("%q", v.Str))
		default:
			out = append(out, path+"="+v.Raw)
		}
	}
	walk("", gjson.Parse(raw))
	return out
}

// diffJSON says where two flattened documents first differ, "" if nowhere.
func diffJSON(want, got []string) string {
	for i := range max(len(want), len(got)) {
		var w, g string
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			return fmt.Sprintf("leaf %d: want %s, got %s", i, w, g)
		}
	}
	return ""
}

// replayModel is served by a replica that replays recorded vLLM streams.
const replayModel = "Qwen/Qwen3-8B"

// startReplay adds to h two replicas that answer each request with the
// stream testdata/assemble/<prompt>.sse, as vLLM streamed it, and counts
// requests that did not ask for a stream with usage on every chunk. Two:
// a JSON answer is assembled from a stream only where it could be hedged
// (with one replica the engine's own JSON is relayed).
func startReplay(t *testing.T, h *servertest.Gateway) *atomic.Int64 {
	t.Helper()
	var notStreamed atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if gjson.GetBytes(body, "stream").Type != gjson.True || gjson.GetBytes(body, "stream_options.include_usage").Type != gjson.True ||
			gjson.GetBytes(body, "stream_options.continuous_usage_stats").Type != gjson.True {
			notStreamed.Add(1)
		}
		name := gjson.GetBytes(body, "messages.0.content").Str
		if name == "" {
			name = gjson.GetBytes(body, "prompt").Str
		}
		sse, err := os.ReadFile(filepath.Join("testdata", "assemble", filepath.Base(name)+".sse"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		_, _ = w.Write(sse)
	}))
	t.Cleanup(srv.Close)
	h.AddReplica("vllm-replay-a", srv.URL, replayModel)
	h.AddReplica("vllm-replay-b", srv.URL, replayModel)
	return &notStreamed
}

// TestAssembledJSONMatchesRecordedVLLMStreams: streams written as vLLM
// sends them (content, reasoning, parallel tool calls, n=2 with logprobs
// and token ids, completions with logprobs) reach a JSON client as the JSON
// answer vLLM gives, field for field and in its order.
func TestAssembledJSONMatchesRecordedVLLMStreams(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	notStreamed := startReplay(t, h)
	client := h.Client(h.Key(policy.KeyOptions{}))
	ctx := context.Background()
	for _, name := range []string{"chat_content", "chat_reasoning", "chat_tools", "chat_logprobs_n2", "completions_logprobs"} {
		t.Run(name, func(t *testing.T) {
			want, err := os.ReadFile(filepath.Join("testdata", "assemble", name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			var got string
			if strings.HasPrefix(name, "chat") {
				resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
					Model: replayModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(name)}, MaxTokens: openai.Int(16),
				})
				if err != nil {
					t.Fatal(err)
				}
				got = resp.RawJSON()
			} else {
				resp, err := client.Completions.New(ctx, openai.CompletionNewParams{
					Model: replayModel, Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(name)}, MaxTokens: openai.Int(3),
				})
				if err != nil {
					t.Fatal(err)
				}
				got = resp.RawJSON()
			}
			if d := diffJSON(flatJSON(string(want), nil), flatJSON(got, nil)); d != "" {
				t.Fatalf("%s\nwant %s\ngot  %s", d, want, got)
			}
		})
	}
	if n := notStreamed.Load(); n != 0 {
		t.Fatalf("%d JSON requests went to the engine without stream and continuous usage", n)
	}
}

// TestJSONClientGetsAnErrorStatusForAnErrorEventMidStream: the engine's
// in-band error after its first token reaches a JSON client as a 502
// upstream_error (nothing had been sent), and the ledger says so.
func TestJSONClientGetsAnErrorStatusForAnErrorEventMidStream(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	startReplay(t, h)
	client := h.Client(h.Key(policy.KeyOptions{}))
	before := len(h.LedgerRows())
	_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: replayModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("chat_error")}, MaxTokens: openai.Int(16),
	})
	var ae *openai.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadGateway || ae.Code != "upstream_error" {
		t.Fatalf("err %v: want 502 upstream_error", err)
	}
	rows := h.LedgerRows()[before:]
	if len(rows) != 1 || rows[0].Status != http.StatusBadGateway || rows[0].CompletionTokens != 0 {
		t.Fatalf("ledger rows %+v: want one 502, nothing billed", rows)
	}
}

// recordingEngine serves a simulated engine and counts the generation
// requests that reached it as streams.
func recordingEngine(t *testing.T, cfg sim.Config) (servertest.Sim, *atomic.Int64) {
	t.Helper()
	eng, err := sim.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var streamed atomic.Int64
	next := eng.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			if gjson.GetBytes(body, "stream").Type == gjson.True {
				streamed.Add(1)
			}
			r.Body = io.NopCloser(strings.NewReader(string(body)))
		}
		next.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return servertest.Sim{Engine: eng, Server: srv, Model: cfg.Model}, &streamed
}

// TestAssembledJSONMatchesTheEnginesOwn sends many seeded requests (chat
// and completions, n 1 to 3, max_tokens, logprobs, tools under every
// tool_choice, a reasoning phase under each of its field names) once to a
// simulated engine with stream: false and once through the gateway, which
// streams from the engine and assembles the answer: the two must be equal
// field for field and in order, except what differs between any two calls
// to one engine: id and created, and each tool call's random id.
func TestAssembledJSONMatchesTheEnginesOwn(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  sim.Config
	}{
		{"plain", sim.Config{}},
		{"reasoning", sim.Config{ReasoningTokens: 3}},
		{"reasoning_content", sim.Config{ReasoningTokens: 2, ReasoningField: sim.ReasoningFieldContent}},
		{"reasoning_both", sim.Config{ReasoningTokens: 2, ReasoningField: sim.ReasoningFieldBoth}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng, streamed := recordingEngine(t, tc.cfg)
			// The engine twice: JSON is assembled where it can be hedged.
			h := servertest.Start(t, servertest.Options{Fleet: []servertest.Sim{eng, eng}})
			gateway := h.Client(h.Key(policy.KeyOptions{}))
			direct := openai.NewClient(option.WithBaseURL(eng.Server.URL+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
			rng := rand.New(rand.NewPCG(15, uint64(len(tc.name))))
			const requests = 40
			for i := range requests {
				chat, opts := seededRequest(rng, i)
				var want, got string
				if chat != nil {
					w, err := direct.Chat.Completions.New(context.Background(), *chat, opts...)
					if err != nil {
						t.Fatalf("request %d direct: %v", i, err)
					}
					g, err := gateway.Chat.Completions.New(context.Background(), *chat, opts...)
					if err != nil {
						t.Fatalf("request %d via the gateway: %v", i, err)
					}
					want, got = w.RawJSON(), g.RawJSON()
				} else {
					p := seededCompletion(rng)
					w, err := direct.Completions.New(context.Background(), p)
					if err != nil {
						var ae *openai.Error
						errors.As(err, &ae)
						t.Fatalf("request %d direct: %v %s", i, err, ae.RawJSON())
					}
					g, err := gateway.Completions.New(context.Background(), p)
					if err != nil {
						t.Fatalf("request %d via the gateway: %v", i, err)
					}
					want, got = w.RawJSON(), g.RawJSON()
				}
				for _, doc := range []string{want, got} {
					gjson.Get(doc, "choices.#.message.tool_calls.#.id").ForEach(func(_, ids gjson.Result) bool {
						ids.ForEach(func(_, id gjson.Result) bool {
							if !strings.HasPrefix(id.Str, "chatcmpl-tool-") {
								t.Errorf("request %d: tool call id %q", i, id.Str)
							}
							return true
						})
						return true
					})
				}
				if d := diffJSON(flatJSON(want, skipPerCall), flatJSON(got, skipPerCall)); d != "" {
					t.Fatalf("request %d: %s\nengine  %s\ngateway %s", i, d, want, got)
				}
			}
			// Each request reached the engine once as JSON (direct) and
			// once as a stream (the gateway's).
			if n := streamed.Load(); n != requests {
				t.Fatalf("the engine saw %d streamed requests of %d sent through the gateway", n, requests)
			}
		})
	}
}

// skipPerCall leaves out what differs between two calls to one engine.
func skipPerCall(path string) bool {
	if path == "id" || path == "created" {
		return true
	}
	_, field, ok := strings.Cut(path, ".tool_calls.")
	return ok && strings.HasSuffix(field, ".id") && strings.Count(field, ".") == 1
}

var seedWords = []string{"alpha", "harbour", "quiet", "engine", "lantern", "seven", "orbit", "paper", "tail", "gate"}

func seedPrompt(rng *rand.Rand) string {
	n := 1 + rng.IntN(12)
	w := make([]string, n)
	for i := range w {
		w[i] = seedWords[rng.IntN(len(seedWords))]
	}
	return strings.Join(w, " ")
}

var seedTools = []map[string]any{
	{"type": "function", "function": map[string]any{"name": "get_weather", "parameters": map[string]any{"type": "object",
		"properties": map[string]any{"city": map[string]any{"type": "string"}, "days": map[string]any{"type": "integer"}}}}},
	{"type": "function", "function": map[string]any{"name": "lookup", "parameters": map[string]any{"type": "object",
		"properties": map[string]any{"query": map[string]any{"type": "string"}, "exact": map[string]any{"type": "boolean"}, "score": map[string]any{"type": "number"}}}}},
}

// seededRequest draws request i: a chat request (with its extra fields as
// options), or nil for a completions request.
func seededRequest(rng *rand.Rand, i int) (*openai.ChatCompletionNewParams, []option.RequestOption) {
	if i%4 == 3 {
		return nil, nil
	}
	p := &openai.ChatCompletionNewParams{
		Model:     servertest.SimModel,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage(seedPrompt(rng))},
		MaxTokens: openai.Int(int64(1 + rng.IntN(24))),
		N:         openai.Int(int64(1 + rng.IntN(3))),
	}
	if rng.IntN(2) == 0 {
		p.Logprobs = openai.Bool(true)
		p.TopLogprobs = openai.Int(int64(rng.IntN(3)))
	}
	var opts []option.RequestOption
	if rng.IntN(3) == 0 {
		opts = append(opts, option.WithJSONSet("ignore_eos", true))
	}
	if rng.IntN(2) == 0 {
		opts = append(opts, option.WithJSONSet("tools", seedTools))
		switch rng.IntN(4) {
		case 1:
			opts = append(opts, option.WithJSONSet("tool_choice", "required"))
		case 2:
			opts = append(opts, option.WithJSONSet("tool_choice", map[string]any{"type": "function", "function": map[string]any{"name": "lookup"}}))
		case 3:
			opts = append(opts, option.WithJSONSet("tool_choice", "none"))
		}
	}
	return p, opts
}

func seededCompletion(rng *rand.Rand) openai.CompletionNewParams {
	p := openai.CompletionNewParams{
		Model:     servertest.SimModel,
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(seedPrompt(rng))},
		MaxTokens: openai.Int(int64(1 + rng.IntN(24))),
		N:         openai.Int(int64(1 + rng.IntN(3))),
	}
	if rng.IntN(2) == 0 {
		p.Logprobs = openai.Int(int64(rng.IntN(3)))
	}
	return p
}

// TestJSONIsAssembledOnlyWhereItCanBeHedged: a JSON request goes to the
// engine as a stream (hedged on its first token, assembled) only while its
// model has more than one replica ready; with one, nothing could be hedged
// or retried elsewhere, and the engine's own JSON answer is relayed. Both
// are billed the engine's usage.
func TestJSONIsAssembledOnlyWhereItCanBeHedged(t *testing.T) {
	eng, streamed := recordingEngine(t, sim.Config{})
	h := servertest.Start(t, servertest.Options{Fleet: []servertest.Sim{eng, eng}})
	client := h.Client(h.Key(policy.KeyOptions{}))
	ask := func() *openai.ChatCompletion {
		t.Helper()
		resp, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model: servertest.SimModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there")}, MaxTokens: openai.Int(5),
		}, option.WithJSONSet("ignore_eos", true))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for _, tc := range []struct {
		name     string
		ready    int
		streamed int64
	}{
		{"two replicas ready: assembled from a stream", 2, 1},
		{"one replica ready: the engine's JSON", 1, 0},
		{"two again", 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := h.Reg.Get("fleet-1")
			if tc.ready == 1 {
				other.SetState(router.StateDraining, "test")
			} else {
				other.SetState(router.StateReady, "")
			}
			before, rows := streamed.Load(), len(h.LedgerRows())
			got := ask()
			if n := streamed.Load() - before; n != tc.streamed {
				t.Fatalf("the engine was asked for %d streams, want %d", n, tc.streamed)
			}
			if got.Object != "chat.completion" || got.Usage.CompletionTokens != 5 || got.Choices[0].Message.Content == "" {
				t.Fatalf("answer %s", got.RawJSON())
			}
			r := h.LedgerRows()[rows:]
			if len(r) != 1 || r[0].CompletionTokens != 5 || r[0].PromptTokens != got.Usage.PromptTokens {
				t.Fatalf("ledger %+v; want one row billed the engine's usage %+v", r, got.Usage)
			}
		})
	}
}
