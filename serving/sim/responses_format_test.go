package sim

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// TestResponsesTextFormatConstrainsTheAnswer: the Responses API's
// text.format, as the official SDK sends it (and the Vercel AI SDK's
// default provider for generateObject), gets an answer the schema accepts,
// JSON and streamed; json_object gets an object; structured_outputs beside
// text.format is a 400, as on vLLM.
func TestResponsesTextFormatConstrainsTheAnswer(t *testing.T) {
	_, srv := start(t, Config{Model: "sim-model"})
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("x"))
	ctx := context.Background()
	validator := compileSchema(t, orderSchema)
	params := responses.ResponseNewParams{
		Model: "sim-model",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("file an order")},
		Text: responses.ResponseTextConfigParam{Format: responses.ResponseFormatTextConfigUnionParam{
			OfJSONSchema: &responses.ResponseFormatTextJSONSchemaConfigParam{Name: "order", Strict: openai.Bool(true), Schema: schemaMap(t, orderSchema)},
		}},
	}
	resp, err := client.Responses.New(ctx, params)
	if err != nil {
		t.Fatalf("responses: %v", err)
	}
	mustConform(t, validator, resp.OutputText())
	if resp.Status != "completed" {
		t.Errorf("status %q, want completed", resp.Status)
	}

	stream := client.Responses.NewStreaming(ctx, params)
	var streamed strings.Builder
	for stream.Next() {
		if ev := stream.Current(); ev.Type == "response.output_text.delta" {
			streamed.WriteString(ev.Delta)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	mustConform(t, validator, streamed.String())

	params.Text = responses.ResponseTextConfigParam{Format: responses.ResponseFormatTextConfigUnionParam{OfJSONObject: &openai.ResponseFormatJSONObjectParam{}}}
	if resp, err = client.Responses.New(ctx, params); err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(resp.OutputText()), &obj); err != nil {
		t.Fatalf("json_object answered %q: %v", resp.OutputText(), err)
	}

	status, _, body := post(t, srv.URL+"/v1/responses", `{"model":"sim-model","input":"x","text":{"format":{"type":"json_object"}},"structured_outputs":{"regex":"a+"}}`)
	if status != 400 || !strings.Contains(string(body), "Cannot specify both structured_outputs and text.format") {
		t.Fatalf("both constraints: %d %s", status, body)
	}
}
