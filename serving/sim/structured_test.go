package sim

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// compileSchema compiles a JSON schema with format assertions on, so a
// date-time that is no date-time fails too.
func compileSchema(t testing.TB, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatalf("schema %s: %v", schema, err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		t.Fatalf("compile %s: %v", schema, err)
	}
	return s
}

// mustConform fails unless text is JSON that schema accepts.
func mustConform(t testing.TB, s *jsonschema.Schema, text string) {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		t.Fatalf("%q is not JSON: %v", text, err)
	}
	if err := s.Validate(v); err != nil {
		t.Fatalf("%s does not conform: %v", text, err)
	}
}

func schemaMap(t testing.TB, schema string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(schema), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// A schema with most of what structured-output users write: strict
// objects, nesting, arrays with bounds, enums, const, ranges, formats,
// patterns, anyOf, $ref into $defs.
const orderSchema = `{
	"type": "object",
	"additionalProperties": false,
	"required": ["id", "customer", "items", "status", "total", "express", "created", "note", "currency", "code"],
	"properties": {
		"id": {"type": "integer", "minimum": 1000, "maximum": 1010},
		"customer": {"$ref": "#/$defs/customer"},
		"items": {"type": "array", "minItems": 2, "maxItems": 3, "items": {"$ref": "#/$defs/item"}},
		"status": {"type": "string", "enum": ["new", "paid", "shipped"]},
		"total": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
		"express": {"type": "boolean"},
		"created": {"type": "string", "format": "date-time"},
		"note": {"anyOf": [{"type": "string", "minLength": 30, "maxLength": 40}, {"type": "null"}]},
		"currency": {"const": "EUR"},
		"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}
	},
	"$defs": {
		"customer": {
			"type": "object", "additionalProperties": false, "required": ["name", "email", "tags"],
			"properties": {
				"name": {"type": "string", "maxLength": 8},
				"email": {"type": "string", "format": "email"},
				"tags": {"type": "array", "items": {"type": "string"}, "maxItems": 0}
			}
		},
		"item": {
			"type": "object", "additionalProperties": false, "required": ["sku", "qty"],
			"properties": {"sku": {"type": "string", "format": "uuid"}, "qty": {"type": "integer", "minimum": 1, "multipleOf": 5}}
		}
	}
}`

// TestStructuredOutputsThroughTheSDK: a json_schema request from the
// official SDK gets a schema-valid answer that finishes with "stop",
// streamed or not, and the same text both ways with usage that counts it.
func TestStructuredOutputsThroughTheSDK(t *testing.T) {
	_, srv := start(t, Config{Model: "sim-model"})
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("x"))
	ctx := context.Background()
	validator := compileSchema(t, orderSchema)

	params := openai.ChatCompletionNewParams{
		Model:    "sim-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("file an order")},
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "order", Strict: openai.Bool(true), Schema: schemaMap(t, orderSchema)},
		}},
	}
	answer, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	content := answer.Choices[0].Message.Content
	mustConform(t, validator, content)
	if answer.Choices[0].FinishReason != "stop" {
		t.Errorf("finish_reason = %q, want stop", answer.Choices[0].FinishReason)
	}
	// The text's tokens (four bytes each) and the end-of-sequence token.
	if want := int64(len(splitTokens(content)) + 1); answer.Usage.CompletionTokens != want {
		t.Errorf("completion_tokens = %d, want %d for %d bytes", answer.Usage.CompletionTokens, want, len(content))
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var streamed strings.Builder
	finish := ""
	var usage openai.CompletionUsage
	for stream.Next() {
		chunk := stream.Current()
		for _, c := range chunk.Choices {
			streamed.WriteString(c.Delta.Content)
			if c.FinishReason != "" {
				finish = c.FinishReason
			}
		}
		if chunk.Usage.CompletionTokens > 0 {
			usage = chunk.Usage
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	mustConform(t, validator, streamed.String())
	if streamed.String() != content || finish != "stop" || usage.CompletionTokens != answer.Usage.CompletionTokens {
		t.Errorf("stream gave %q (%s, %d tokens), JSON gave %q (%d tokens)", streamed.String(), finish, usage.CompletionTokens, content, answer.Usage.CompletionTokens)
	}

	// A cap too small for the object cuts it off with "length", as on vLLM.
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
	params.MaxCompletionTokens = openai.Int(5)
	short, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	if got := short.Choices[0].Message.Content; short.Choices[0].FinishReason != "length" || got != content[:len(got)] || len(got) == 0 || json.Valid([]byte(got)) {
		t.Errorf("capped answer %q (%s), want a cut-off prefix of %q with length", got, short.Choices[0].FinishReason, content)
	}
}

// TestJSONObjectAndChoiceAndRegex covers the other constraints, on chat and
// completions, in vLLM's current fields and the legacy guided_* ones.
func TestJSONObjectAndChoiceAndRegex(t *testing.T) {
	_, srv := start(t, Config{Model: "sim-model"})
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("x"))
	ctx := context.Background()
	chat := func(t *testing.T, opts ...option.RequestOption) (string, string) {
		t.Helper()
		a, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "sim-model",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("how was it?")},
		}, opts...)
		if err != nil {
			t.Fatalf("chat: %v", err)
		}
		return a.Choices[0].Message.Content, string(a.Choices[0].FinishReason)
	}

	t.Run("json_object", func(t *testing.T) {
		text, finish := chat(t, option.WithJSONSet("response_format", map[string]any{"type": "json_object"}))
		var obj map[string]any
		if err := json.Unmarshal([]byte(text), &obj); err != nil || len(obj) == 0 || finish != "stop" {
			t.Errorf("json_object answer %q (%s): %v", text, finish, err)
		}
	})
	choices := []string{"positive", "negative", "neutral"}
	for _, field := range []string{"structured_outputs", "guided_choice"} {
		t.Run(field, func(t *testing.T) {
			var v any = map[string]any{"choice": choices}
			if field == "guided_choice" {
				v = choices
			}
			text, finish := chat(t, option.WithJSONSet(field, v))
			if !strings.Contains(strings.Join(choices, "|"), text) || text == "" || strings.Contains(text, "|") || finish != "stop" {
				t.Errorf("answer %q (%s), want one of %v", text, finish, choices)
			}
		})
	}
	pattern := `[A-Z]{3}-\d{4}( v[0-9]+)?`
	for _, field := range []string{"structured_outputs", "guided_regex"} {
		t.Run(field, func(t *testing.T) {
			var v any = map[string]any{"regex": pattern}
			if field == "guided_regex" {
				v = pattern
			}
			text, _ := chat(t, option.WithJSONSet(field, v))
			if !regexp.MustCompile(`^(?:` + pattern + `)$`).MatchString(text) {
				t.Errorf("answer %q does not match %s", text, pattern)
			}
		})
	}
	t.Run("guided_json", func(t *testing.T) {
		schema := `{"type":"object","properties":{"mood":{"enum":["ok","great"]}},"required":["mood"]}`
		text, _ := chat(t, option.WithJSONSet("guided_json", schemaMap(t, schema)))
		mustConform(t, compileSchema(t, schema), text)
	})

	t.Run("completions", func(t *testing.T) {
		schema := `{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"]}`
		params := openai.CompletionNewParams{
			Model:  "sim-model",
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("plan a trip")},
		}
		rf := option.WithJSONSet("response_format", map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "trip", "schema": schemaMap(t, schema)}})
		// CompletionRequest's default cap of 16 tokens holds this object.
		c, err := client.Completions.New(ctx, params, rf)
		if err != nil {
			t.Fatalf("completions: %v", err)
		}
		mustConform(t, compileSchema(t, schema), c.Choices[0].Text)
		if c.Choices[0].FinishReason != "stop" {
			t.Errorf("finish_reason %q", c.Choices[0].FinishReason)
		}
		stream := client.Completions.NewStreaming(ctx, params, rf)
		var text strings.Builder
		for stream.Next() {
			for _, ch := range stream.Current().Choices {
				text.WriteString(ch.Text)
			}
		}
		if err := stream.Err(); err != nil || text.String() != c.Choices[0].Text {
			t.Errorf("streamed %q (%v), want %q", text.String(), err, c.Choices[0].Text)
		}
	})

	t.Run("unsupported grammar is a clear 400", func(t *testing.T) {
		_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "sim-model",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		}, option.WithJSONSet("structured_outputs", map[string]any{"grammar": "root ::= \"a\""}))
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(apiErr.Message, "grammar") {
			t.Errorf("grammar error = %v", err)
		}
	})
}

// TestStrictToolCallArgumentsConform: with tool_choice required or a named
// function, the call's arguments are a value of the tool's schema.
func TestStrictToolCallArgumentsConform(t *testing.T) {
	_, srv := start(t, Config{Model: "sim-model"})
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("x"))
	const schema = `{
		"type": "object", "additionalProperties": false, "required": ["city", "unit", "days", "when"],
		"properties": {
			"city": {"type": "string", "minLength": 3},
			"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
			"days": {"type": "integer", "minimum": 1, "maximum": 14},
			"when": {"type": "object", "additionalProperties": false, "required": ["from"],
				"properties": {"from": {"type": "string", "format": "date"}}}
		}
	}`
	validator := compileSchema(t, schema)
	tool := openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
		Name: "forecast", Strict: openai.Bool(true), Parameters: schemaMap(t, schema),
	})
	for _, choice := range []openai.ChatCompletionToolChoiceOptionUnionParam{
		{OfAuto: openai.String("required")},
		openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "forecast"}),
	} {
		for _, prompt := range []string{"weather in Paris?", "and in Rome?", "Oslo next week"} {
			a, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
				Model:      "sim-model",
				Messages:   []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
				Tools:      []openai.ChatCompletionToolUnionParam{tool},
				ToolChoice: choice,
			})
			if err != nil {
				t.Fatalf("chat: %v", err)
			}
			calls := a.Choices[0].Message.ToolCalls
			if len(calls) != 1 || calls[0].Function.Name != "forecast" {
				t.Fatalf("tool calls = %+v", calls)
			}
			mustConform(t, validator, calls[0].Function.Arguments)
		}
	}
}

// TestFillSchemaConforms pins the filler against a validator over the
// keywords it claims to honour, for many seeds.
func TestFillSchemaConforms(t *testing.T) {
	schemas := []string{
		orderSchema,
		`{"type":"string","minLength":50}`,
		`{"type":"string","maxLength":3}`,
		`{"type":"integer","minimum":-5,"exclusiveMaximum":-3}`,
		`{"type":"integer","multipleOf":7,"minimum":10,"maximum":30}`,
		`{"type":"number","minimum":2.5,"maximum":2.5}`,
		`{"type":"number","exclusiveMinimum":1,"exclusiveMaximum":1.001}`,
		`{"type":["null","boolean"]}`,
		`{"type":"array","prefixItems":[{"const":1},{"type":"string"}],"items":{"type":"boolean"},"minItems":4}`,
		`{"type":"object","minProperties":2,"additionalProperties":{"type":"integer"}}`,
		`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"},"d":{"type":"integer"},"e":{"type":"integer"}},"required":["e"]}`,
		`{"allOf":[{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]},{"properties":{"b":{"type":"boolean"}},"required":["b"]}]}`,
		`{"oneOf":[{"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"number","minimum":0}},"required":["kind","r"]},{"type":"string"}]}`,
		`{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v"]}},"$ref":"#/$defs/node"}`,
		`{"definitions":{"n":{"type":"integer","maximum":0}},"type":"object","properties":{"x":{"$ref":"#/definitions/n"}},"required":["x"]}`,
		`{"type":"string","format":"ipv6"}`,
		`{"type":"string","format":"uri"}`,
		`{"type":"string","pattern":"^(foo|bar)+[0-9]{2,}$"}`,
		`{}`,
		`true`,
	}
	for _, s := range schemas {
		v := compileSchema(t, s)
		for h := range uint32(40) {
			out, err := fillSchema(json.RawMessage(s), h*0x01000193+7)
			if err != nil {
				t.Fatalf("fill %s: %v", s, err)
			}
			mustConform(t, v, out)
		}
	}
	for _, bad := range []string{`false`, `{"enum":[]}`, `{"$ref":"#/$defs/missing"}`, `{"$defs":{"a":{"type":"object","properties":{"a":{"$ref":"#/$defs/a"}},"required":["a"]}},"$ref":"#/$defs/a"}`} {
		if out, err := fillSchema(json.RawMessage(bad), 1); err == nil {
			t.Errorf("fill %s = %s, want an error", bad, out)
		}
	}
}
