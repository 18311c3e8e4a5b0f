package sse

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// Chunk prefixes as vLLM writes them (pydantic model_dump_json: no spaces).
const (
	chatHead = `{"id":"chatcmpl-8c1f0e6a2b","object":"chat.completion.chunk","created":1760000000,"model":"Qwen/Qwen3-8B",`
	cmplHead = `{"id":"cmpl-3f9a77d0","object":"text_completion","created":1760000000,"model":"Qwen/Qwen3-8B",`
	fp       = `"system_fingerprint":"vllm-0.25.1-tp4-dp2-ep-e94c540a"`
)

type wireCase struct {
	name   string
	ev     string // the event as on the wire, blank line included
	kind   Kind
	pieces int // of a Token event
}

// wireCases are events as vLLM (and, where named, OpenAI and the simulated
// engine) put them on the wire. Sources: vLLM's
// chat_completion/serving.py chat_completion_stream_generator (@006c49d4),
// completion/serving.py completion_stream_generator (@cc139d8e, @030ea52e),
// generate/base/protocol.py DeltaMessage/DeltaToolCall (@022e555d), the
// older protocol.py DeltaMessage with reasoning_content, serving_engine.py
// create_streaming_error_response (@0030b9ff, old ErrorResponse with
// "object":"error") and the current one (ErrorResponse{error: ErrorInfo},
// json.dumps, so with spaces), and the 0.25.1 capture in vllm#54664.
var wireCases = []wireCase{
	// Chat: the opening role chunk carries no output.
	{"vllm role chunk (0.25.1 capture)",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}` + "\n\n",
		Other, 0},
	{"vllm role chunk with continuous_usage_stats",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":17,"total_tokens":17,"completion_tokens":0}}` + "\n\n",
		Other, 0},
	{"vllm role chunk with continuous usage and a reasoning parser",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":17,"total_tokens":17,"completion_tokens":0,"completion_tokens_details":{"reasoning_tokens":0}}}` + "\n\n",
		Other, 0},
	{"vllm role chunk with return_token_ids and a prompt_text that spells output keys",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[151644,872,198,90,1],"prompt_text":"<|im_start|>user\n{\"content\":\"hi\",\"reasoning\":\"x\",\"tool_calls\":[{\"id\":1}],\"finish_reason\":\"stop\"}<|im_end|>\n<|im_start|>assistant\n"}` + "\n\n",
		Other, 0},
	{"sim role chunk",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		Other, 0},

	// Chat: content.
	{"vllm content delta",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":" Paris"},"logprobs":null,"finish_reason":null,"token_ids":null}]}` + "\n\n",
		Token, 1},
	{"vllm merged delta of several tokens counts one piece",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":" is the capital of"},"logprobs":null,"finish_reason":null,"token_ids":null}]}` + "\n\n",
		Token, 1},
	{"vllm content delta with continuous usage",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null,"token_ids":null}],"usage":{"prompt_tokens":17,"total_tokens":18,"completion_tokens":1}}` + "\n\n",
		Token, 1},
	{"vllm content delta with logprobs (logprobs.content is an array)",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-0.0123,"bytes":[72,105],"top_logprobs":[]}]},"finish_reason":null,"token_ids":null}]}` + "\n\n",
		Token, 1},
	{"vllm empty content while the detokenizer holds a partial character",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":null,"token_ids":null}]}` + "\n\n",
		Other, 0},
	{"vllm empty delta carrying only logprobs",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{},"logprobs":{"content":[{"token":"<tool_call>","logprob":-0.5,"bytes":[60],"top_logprobs":[]}]},"finish_reason":null,"token_ids":null}]}` + "\n\n",
		Other, 0},
	{"content that spells keys inside its string",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":"say \"content\":\"\" or \"tool_calls\":[] or \"finish_reason\":null"},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		Token, 1},
	{"content of an escaped quote only",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":"\""},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		Token, 1},
	{"content null",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":null},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		Other, 0},

	// Chat: the end.
	{"vllm EOS: empty content with finish_reason stop",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null}],` + fp + "}\n\n",
		Token, 0},
	{"vllm last token with finish_reason length (0.25.1 capture)",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"reasoning":" need"},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}],` + fp + "}\n\n",
		Token, 1},
	{"vllm finish with empty delta",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":151645,"token_ids":null}]}` + "\n\n",
		Token, 0},
	{"vllm usage-only chunk (include_usage)",
		"data: " + chatHead + `"choices":[],"usage":{"prompt_tokens":17,"total_tokens":33,"completion_tokens":16},` + fp + "}\n\n",
		Other, 0},
	{"vllm usage-only chunk with reasoning tokens and per-request metrics",
		"data: " + chatHead + `"choices":[],"usage":{"prompt_tokens":17,"total_tokens":529,"completion_tokens":512,"completion_tokens_details":{"reasoning_tokens":480}},` + fp + `,"metrics":{"time_to_first_token_ms":41.2,"generation_time_ms":2210.7,"queue_time_ms":0.3}}` + "\n\n",
		Other, 0},

	// Chat: reasoning.
	{"vllm reasoning delta (current, 0.25.1 capture)",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"reasoning":"We"},"logprobs":null,"finish_reason":null,"token_ids":null}]}` + "\n\n",
		Token, 1},
	{"vllm 0.11 reasoning under both names",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"reasoning":"Okay","reasoning_content":"Okay"},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		Token, 1},
	{"vllm 0.10 reasoning_content",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"reasoning_content":"Okay"},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		Token, 1},
	{"reasoning_content null beside empty content",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":"","reasoning_content":null},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		Other, 0},
	{"content null beside reasoning",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":null,"reasoning":"Hmm"},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		Token, 1},
	{"empty reasoning",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"reasoning":""},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		Other, 0},
	{"reasoning ends and content starts in one delta",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"reasoning":".","content":"The"},"logprobs":null,"finish_reason":null,"token_ids":null}]}` + "\n\n",
		Token, 1},

	// Chat: tool calls.
	{"vllm tool call opens (id, type, index, function name)",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-5b7d3c1e","type":"function","index":0,"function":{"name":"get_weather"}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}` + "\n\n",
		Token, 1},
	{"vllm tool call arguments delta",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": \""}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}` + "\n\n",
		Token, 1},
	{"tool call arguments that spell empty keys",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":"","tool_calls":[{"index":0,"function":{"arguments":"{\"content\":\"\",\"tool_calls\":[]}"}}]},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		Token, 1},
	{"vllm tool call finish",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null,"token_ids":null}]}` + "\n\n",
		Token, 0},
	{"empty tool_calls array",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":"","tool_calls":[]},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		Other, 0},

	// Chat: OpenAI's own shapes (a gateway upstream may be one).
	{"openai role chunk with refusal null",
		`data: {"id":"chatcmpl-B9x","object":"chat.completion.chunk","created":1727000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_5f","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		Other, 0},
	{"openai refusal delta",
		`data: {"id":"chatcmpl-B9x","object":"chat.completion.chunk","created":1727000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_5f","choices":[{"index":0,"delta":{"refusal":"I'm sorry"},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		Token, 1},
	{"openai tool call with content null",
		`data: {"id":"chatcmpl-B9x","object":"chat.completion.chunk","created":1727000000,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_abc","type":"function","function":{"name":"get_weather","arguments":""}}],"refusal":null},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		Token, 1},

	// Chat: several choices.
	{"vllm n=2 sends one choice per chunk",
		"data: " + chatHead + `"choices":[{"index":1,"delta":{"content":" Lyon"},"logprobs":null,"finish_reason":null,"token_ids":null}]}` + "\n\n",
		Token, 1},
	{"two choices with output in one chunk",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":"A"},"finish_reason":null},{"index":1,"delta":{"reasoning":"B"},"finish_reason":null}]}` + "\n\n",
		Token, 2},
	{"two choices, one with output",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":"A","reasoning":"a"},"finish_reason":null},{"index":1,"delta":{"content":""},"finish_reason":"stop"}]}` + "\n\n",
		Token, 1},
	{"a whole message in one event",
		"data: " + chatHead + `"choices":[{"index":0,"message":{"role":"assistant","content":"Paris.","tool_calls":[]},"logprobs":null,"finish_reason":"stop"}]}` + "\n\n",
		Token, 1},

	// Completions.
	{"vllm completion text (exclude_unset=False, every field)",
		"data: " + cmplHead + `"choices":[{"index":0,"text":" Paris","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":null}` + "\n\n",
		Token, 1},
	{"vllm completion text (current)",
		"data: " + cmplHead + `"choices":[{"index":0,"text":" Paris","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}` + "\n\n",
		Token, 1},
	{"vllm completion text with logprobs",
		"data: " + cmplHead + `"choices":[{"index":0,"text":" Paris","logprobs":{"text_offset":[0],"token_logprobs":[-0.01],"tokens":[" Paris"],"top_logprobs":[{" Paris":-0.01}]},"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}` + "\n\n",
		Token, 1},
	{"vllm completion empty text (partial character)",
		"data: " + cmplHead + `"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}` + "\n\n",
		Other, 0},
	{"vllm completion EOS with finish_reason",
		"data: " + cmplHead + `"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"stop","stop_reason":null,"prompt_token_ids":null,"token_ids":null}],` + fp + "}\n\n",
		Token, 0},
	{"vllm completion with continuous usage",
		"data: " + cmplHead + `"choices":[{"index":0,"text":" Paris","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1}}` + "\n\n",
		Token, 1},
	{"vllm completion usage-only chunk",
		"data: " + cmplHead + `"choices":[],"usage":{"prompt_tokens":5,"total_tokens":21,"completion_tokens":16},` + fp + "}\n\n",
		Other, 0},
	{"sim completion token",
		"data: " + cmplHead + `"choices":[{"index":0,"text":"lorem","logprobs":null,"finish_reason":null,"stop_reason":null}]}` + "\n\n",
		Token, 1},
	{"two completion choices in one chunk",
		"data: " + cmplHead + `"choices":[{"index":0,"text":"a","finish_reason":null},{"index":1,"text":"b","finish_reason":null}]}` + "\n\n",
		Token, 2},

	// Errors.
	{"vllm in-band error (json.dumps, spaces)",
		`data: {"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}` + "\n\n",
		Error, 0},
	{"vllm 0.4-0.6 in-band error with object error",
		`data: {"error": {"object": "error", "message": "This model's maximum context length is 4096 tokens.", "type": "BadRequestError", "param": null, "code": 400}}` + "\n\n",
		Error, 0},
	{"bare error object",
		`data: {"object": "error", "message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}` + "\n\n",
		Error, 0},
	{"openai error shape (the gateway's own midstream event)",
		`data: {"error":{"message":"the model replica failed in the middle of the answer; the output is incomplete","type":"server_error","param":null,"code":"upstream_midstream_error"}}` + "\n\n",
		Error, 0},
	{"error key after others",
		`data: {"id":"x","error":{"message":"boom"}}` + "\n\n",
		Error, 0},
	{"content that is the word error",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":"\"error\""},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		Token, 1},
	{"error null is no error",
		`data: {"choices":[],"error":null}` + "\n\n",
		Other, 0},

	// Done and comments.
	{"done", "data: [DONE]\n\n", Done, 0},
	{"done without the space", "data:[DONE]\n\n", Done, 0},
	{"done with CRLF", "data: [DONE]\r\n\r\n", Done, 0},
	{"keep-alive comment", ": keep-alive\n\n", Comment, 0},
	{"tailgate timing comment", ": tailgate-timing engine_ttft_ms=12.345 engine_queue_ms=0.210\n\n", Comment, 0},
	{"sim queue comment", ": sim-queue-ms=1.234\n\n", Comment, 0},
	{"event field without data", "event: ping\n\n", Comment, 0},
	{"empty data", "data:\n\n", Other, 0},
	{"data that is no JSON", "data: hello\n\n", Other, 0},

	// Line shapes.
	{"CRLF token event",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}` + "\r\n\r\n",
		Token, 1},
	{"comment before the data line",
		": ping\ndata: " + chatHead + `"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		Token, 1},
	{"id and event fields around the data line",
		"id: 7\nevent: message\ndata: " + chatHead + `"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}` + "\nretry: 1000\n\n",
		Token, 1},
	{"multi-line data joined",
		"data: " + chatHead + "\n" + `data: "choices":[{"index":0,"delta":{"content":"Hi"},` + "\n" + `data: "logprobs":null,"finish_reason":null}]}` + "\n\n",
		Token, 1},
	{"multi-line data whose token key is on the second line",
		"data: {\"choices\":[{\"index\":0,\"delta\":{\ndata: \"reasoning\":\"x\"}}]}\n\n",
		Token, 1},
	{"json.dumps spacing (a Python proxy)",
		`data: {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": null}]}` + "\n\n",
		Token, 1},
	{"json.dumps spacing, empty content",
		`data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}` + "\n\n",
		Other, 0},
	{"json.dumps spacing, empty tool calls",
		`data: {"choices": [{"index": 0, "delta": {"tool_calls": [ ]}, "finish_reason": null}]}` + "\n\n",
		Other, 0},
	{"long content (> 64 KiB)",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("ab", 40<<10) + `"},"logprobs":null,"finish_reason":null}]}` + "\n\n",
		Token, 1},
	{"long role chunk (> 64 KiB of prompt_token_ids)",
		"data: " + chatHead + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[` + strings.Repeat("151644,", 12<<10) + `1],"prompt_text":null}` + "\n\n",
		Other, 0},
}

func TestClassifyWireShapes(t *testing.T) {
	for _, tc := range wireCases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Classify([]byte(tc.ev)); got != tc.kind {
				t.Errorf("Classify = %v, want %v\n%s", got, tc.kind, short(tc.ev))
			}
			p := Data([]byte(tc.ev))
			if want := tc.pieces; tc.kind == Token || tc.kind == Other {
				if got := Pieces(p); got != want {
					t.Errorf("Pieces = %d, want %d\n%s", got, want, short(tc.ev))
				}
			}
			// The table itself must agree with a parse of the JSON, so a
			// row cannot pin a byte-scan accident.
			if tc.kind == Token || tc.kind == Other {
				if !json.Valid(p) && tc.name != "data that is no JSON" && tc.name != "empty data" {
					t.Fatalf("row payload is no JSON: %s", short(string(p)))
				}
				if json.Valid(p) {
					if k, n := oracle(t, p); k != tc.kind || n != tc.pieces {
						t.Errorf("row says %v/%d, a parse says %v/%d", tc.kind, tc.pieces, k, n)
					}
				}
			}
		})
	}
}

func TestData(t *testing.T) {
	tests := []struct {
		name, ev string
		want     []byte // nil: no data line
	}{
		{"one space removed", "data: {\"a\":1}\n\n", []byte(`{"a":1}`)},
		{"no space", "data:{\"a\":1}\n\n", []byte(`{"a":1}`)},
		{"only one space removed", "data:  x\n\n", []byte(" x")},
		{"CR removed", "data: x\r\n\r\n", []byte("x")},
		{"empty data is not nil", "data:\n\n", []byte{}},
		{"comment only", ": keep-alive\n\n", nil},
		{"after a comment", ": c\ndata: x\n\n", []byte("x")},
		{"no final newline", "data: x", []byte("x")},
		{"lines joined", "data: a\ndata: b\r\n: c\ndata:c\n\n", []byte("a\nb\nc")},
		{"a field that only starts like data", "database: x\n\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Data([]byte(tt.ev))
			if (got == nil) != (tt.want == nil) || !bytes.Equal(got, tt.want) {
				t.Errorf("Data(%q) = %q (nil %v), want %q (nil %v)", tt.ev, got, got == nil, tt.want, tt.want == nil)
			}
		})
	}
}

func TestDataIsASliceOfTheEventWhenOneLine(t *testing.T) {
	ev := []byte("data: {\"a\":1}\n\n")
	p := Data(ev)
	if &p[0] != &ev[len("data: ")] {
		t.Error("Data copied a one-line payload")
	}
	if n := testing.AllocsPerRun(100, func() { Classify(ev) }); n != 0 {
		t.Errorf("Classify allocates %v times per event", n)
	}
}

func TestKindString(t *testing.T) {
	for k, want := range map[Kind]string{Comment: "Comment", Other: "Other", Token: "Token", Done: "Done", Error: "Error", 9: "Kind(9)"} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", k, got, want)
		}
	}
}

// oracle classifies a JSON payload by decoding it, independently of the
// byte scan: Token when a choice carries output or a finish_reason, with
// the number of choices that carry output.
func oracle(t testing.TB, p []byte) (Kind, int) {
	t.Helper()
	var chunk struct {
		Error   json.RawMessage `json:"error"`
		Object  string          `json:"object"`
		Choices []struct {
			Text         *string        `json:"text"`
			Delta        *oracleMessage `json:"delta"`
			Message      *oracleMessage `json:"message"`
			FinishReason *string        `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(p, &chunk); err != nil {
		return Other, 0
	}
	kind, n := Other, 0
	for _, c := range chunk.Choices {
		out := c.Text != nil && *c.Text != "" || c.Delta.output() || c.Message.output()
		if out {
			n++
		}
		if out || c.FinishReason != nil {
			kind = Token
		}
	}
	if kind == Other && (len(chunk.Error) > 0 && string(chunk.Error) != "null" || chunk.Object == "error") {
		kind = Error
	}
	return kind, n
}

type oracleMessage struct {
	Content          any               `json:"content"` // a string in chat; anything else is no output
	Reasoning        string            `json:"reasoning"`
	ReasoningContent string            `json:"reasoning_content"`
	Refusal          string            `json:"refusal"`
	ToolCalls        []json.RawMessage `json:"tool_calls"`
}

func (m *oracleMessage) output() bool {
	if m == nil {
		return false
	}
	s, _ := m.Content.(string)
	return s != "" || m.Reasoning != "" || m.ReasoningContent != "" || m.Refusal != "" || len(m.ToolCalls) > 0
}

func short(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// FuzzClassify builds chunks from fuzzed strings (which may spell keys, hold
// quotes, backslashes and newlines) with encoding/json and checks the byte
// scan against a decode of the same JSON.
func FuzzClassify(f *testing.F) {
	f.Add("", "", "", uint8(0), uint8(0))
	f.Add(`"content":"x"`, `\"`, `{"content":""}`, uint8(0b0101_0101), uint8(1))
	f.Add("Hi", "", `"tool_calls":[]`, uint8(0b1010_1010), uint8(2))
	f.Add(`","finish_reason":"stop`, "null", "[]", uint8(0xff), uint8(1))
	f.Fuzz(func(t *testing.T, content, reasoning, args string, flags, shape uint8) {
		delta := func(flags uint8, content, reasoning, args string) map[string]any {
			d := map[string]any{}
			if flags&1 != 0 {
				d["role"] = "assistant"
			}
			if flags&2 != 0 {
				d["content"] = nil
			} else {
				d["content"] = content
			}
			if flags&8 == 0 {
				key := "reasoning"
				if flags&4 != 0 {
					key = "reasoning_content"
				}
				d[key] = reasoning
			}
			switch {
			case flags&16 != 0:
				d["tool_calls"] = []any{map[string]any{"index": 0, "function": map[string]any{"arguments": args}}}
			case flags&32 != 0:
				d["tool_calls"] = []any{}
			}
			return d
		}
		finish := func(set bool) any {
			if set {
				return "stop"
			}
			return nil
		}
		var choices []any
		object := "chat.completion.chunk"
		switch shape % 3 {
		case 0: // chat, one choice, as vLLM sends even for n>1
			choices = []any{map[string]any{"index": 0, "delta": delta(flags, content, reasoning, args), "logprobs": nil, "finish_reason": finish(flags&64 != 0)}}
		case 1: // chat, two choices in one chunk
			choices = []any{
				map[string]any{"index": 0, "delta": delta(flags, content, reasoning, args), "finish_reason": finish(flags&64 != 0)},
				map[string]any{"index": 1, "delta": delta(flags>>1|flags<<7, args, content, reasoning), "finish_reason": finish(flags&128 != 0)},
			}
		default: // completions, one or two choices
			object = "text_completion"
			choices = []any{map[string]any{"index": 0, "text": content, "logprobs": nil, "finish_reason": finish(flags&64 != 0)}}
			if flags&1 != 0 {
				choices = append(choices, map[string]any{"index": 1, "text": args, "finish_reason": finish(flags&128 != 0)})
			}
		}
		chunk := map[string]any{"id": "chatcmpl-" + args, "object": object, "choices": choices, "prompt_text": content}

		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(len(content)%2 == 0)
		if len(reasoning)%3 == 1 {
			enc.SetIndent("", " ") // becomes several data lines below
		}
		if err := enc.Encode(chunk); err != nil {
			t.Skip(err)
		}
		payload := bytes.TrimSuffix(b.Bytes(), []byte("\n"))
		var ev []byte
		for line := range bytes.SplitSeq(payload, []byte("\n")) {
			ev = append(append(append(ev, "data: "...), line...), '\n')
		}
		ev = append(ev, '\n')

		wantKind, wantPieces := oracle(t, payload)
		if got := Classify(ev); got != wantKind {
			t.Fatalf("Classify = %v, a parse says %v\n%s", got, wantKind, ev)
		}
		if got := Pieces(Data(ev)); got != wantPieces {
			t.Fatalf("Pieces = %d, a parse says %d\n%s", got, wantPieces, ev)
		}
	})
}
