package e2e

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// invoiceSchema is a strict schema of the kind an SDK's structured-output
// helper sends: required fields, an enum, bounds, an array of objects.
const invoiceSchema = `{
  "type": "object",
  "additionalProperties": false,
  "required": ["customer", "status", "total", "lines"],
  "properties": {
    "customer": {"type": "string", "minLength": 3},
    "status": {"type": "string", "enum": ["draft", "sent", "paid"]},
    "total": {"type": "number", "minimum": 0},
    "lines": {
      "type": "array", "minItems": 1, "maxItems": 3,
      "items": {
        "type": "object",
        "additionalProperties": false,
        "required": ["sku", "quantity"],
        "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1}}
      }
    }
  }
}`

// invoice is what the client decodes the answer into, as it would with
// the SDK's structured outputs.
type invoice struct {
	Customer string  `json:"customer"`
	Status   string  `json:"status"`
	Total    float64 `json:"total"`
	Lines    []struct {
		SKU      string `json:"sku"`
		Quantity int    `json:"quantity"`
	} `json:"lines"`
}

// TestStructuredOutputThroughUp: the official OpenAI Go SDK's
// structured-output request (response_format json_schema, strict) sent to
// `tailgate up` — through the gateway, a worker's sidecar and the
// simulated engine — gets an answer that validates against the schema and
// decodes into the client's type, streamed and not; a json_object request
// gets a JSON object. Against a gateway or worker that dropped
// response_format on the way, the sim would answer filler words and this
// test would fail.
func TestStructuredOutputThroughUp(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	dir := t.TempDir()
	up := startProc(t, "tailgate up", true, "up", "--data", dir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--replicas", "1", "--sim-ttft", "1ms", "--sim-tpot", "0s")
	var banner, api string
	up.scanUntil(func(line string) bool {
		banner += line + "\n"
		if m := apiLine.FindStringSubmatch(line); m != nil {
			api = m[1]
		}
		return api != ""
	})
	if api == "" {
		t.Fatalf("up printed no API address; stderr:\n%s", up.stderr.String())
	}
	if !strings.Contains(banner, "structured outputs are filler that fits the schema") {
		t.Errorf("up's banner does not say that structured outputs are filler:\n%s", banner)
	}
	waitHealthy(t, strings.TrimSuffix(api, "/v1"))
	p := &upProcess{process: up, dir: dir, api: api, demoKey: readToken(t, filepath.Join(dir, "demo.key"))}

	c := jsonschema.NewCompiler()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(invoiceSchema))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource("invoice.json", doc); err != nil {
		t.Fatal(err)
	}
	validator, err := c.Compile("invoice.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal([]byte(invoiceSchema), &schema); err != nil {
		t.Fatal(err)
	}
	conforms := func(t *testing.T, text string) {
		t.Helper()
		v, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
		if err != nil {
			t.Fatalf("not JSON: %v\n%s", err, text)
		}
		if err := validator.Validate(v); err != nil {
			t.Fatalf("does not fit the schema: %v\n%s", err, text)
		}
		var inv invoice
		if err := json.Unmarshal([]byte(text), &inv); err != nil || len(inv.Lines) == 0 {
			t.Fatalf("does not decode into the client's type (%v): %s", err, text)
		}
	}

	client := p.client(p.demoKey)
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model:    "tailgate-sim",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("draft an invoice")},
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "invoice", Strict: openai.Bool(true), Schema: schema},
		}},
	}

	t.Run("json_schema", func(t *testing.T) {
		a, err := client.Chat.Completions.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if a.Choices[0].FinishReason != "stop" {
			t.Errorf("finish_reason %q, want stop (a cut answer is what SDK helpers refuse)", a.Choices[0].FinishReason)
		}
		conforms(t, a.Choices[0].Message.Content)
	})

	t.Run("json_schema streamed", func(t *testing.T) {
		stream := client.Chat.Completions.NewStreaming(ctx, params)
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if len(acc.Choices) == 0 {
			t.Fatal("no choices streamed")
		}
		if acc.Choices[0].FinishReason != "stop" {
			t.Errorf("finish_reason %q, want stop", acc.Choices[0].FinishReason)
		}
		conforms(t, acc.Choices[0].Message.Content)
	})

	t.Run("json_object", func(t *testing.T) {
		a, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "tailgate-sim",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("answer in JSON")},
			ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{
				OfJSONObject: &shared.ResponseFormatJSONObjectParam{},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		var obj map[string]any
		if err := json.Unmarshal([]byte(a.Choices[0].Message.Content), &obj); err != nil {
			t.Errorf("not a JSON object: %v\n%s", err, a.Choices[0].Message.Content)
		}
	})
}
