package sim

import "testing"

const (
	user   = `"messages":[{"role":"user","content":"hello"}]`
	sample = `{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}`
	tool   = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":` + sample + `}}]`
	think  = 2 // reasoning tokens in the cases that think
)

// TestChatWire pins /v1/chat/completions: vLLM's ChatCompletionResponse
// and stream chunks (vllm/entrypoints/openai/chat_completion/protocol.py@002032ee,
// serving.py@006c49d4).
func TestChatWire(t *testing.T) {
	for _, c := range []wireCase{
		{name: "json", body: `{` + user + `,"max_tokens":2}`, want: `{"id":"chatcmpl-ID","object":"chat.completion","created":0,"model":"tailgate-sim","choices":[{"index":0,"message":{"role":"assistant","content":"elit incididunt ","refusal":null,"annotations":null,"audio":null,"function_call":null,"reasoning":null},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-sim-d79083ea","usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2,"prompt_tokens_details":null,"completion_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}`},
		{name: "stream without usage", body: `{` + user + `,"max_tokens":2,"stream":true}`, want: `data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}

: sim-queue-ms=Q

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"content":"elit "},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"content":"incididunt "},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}],"system_fingerprint":"vllm-sim-d79083ea"}

data: [DONE]

`},
		{name: "stream with empty stream_options", body: `{` + user + `,"max_tokens":2,"stream":true,"stream_options":{}}`, want: `data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}

: sim-queue-ms=Q

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"content":"elit "},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"content":"incididunt "},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}],"system_fingerprint":"vllm-sim-d79083ea"}

data: [DONE]

`},
		{name: "stream with continuous usage", body: `{` + user + `,"max_tokens":2,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, want: `data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":9,"total_tokens":9,"completion_tokens":0,"completion_tokens_details":null},"prompt_token_ids":null,"prompt_text":null}

: sim-queue-ms=Q

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"content":"elit "},"logprobs":null,"finish_reason":null,"token_ids":null}],"usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1,"completion_tokens_details":null}}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"content":"incididunt "},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}],"usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2,"completion_tokens_details":null}}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[],"usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2},"system_fingerprint":"vllm-sim-d79083ea"}

data: [DONE]

`},
		{name: "json with reasoning", cfg: Config{ReasoningTokens: think}, body: `{` + user + `,"max_tokens":3}`, want: `{"id":"chatcmpl-ID","object":"chat.completion","created":0,"model":"tailgate-sim","choices":[{"index":0,"message":{"role":"assistant","content":"elit ","refusal":null,"annotations":null,"audio":null,"function_call":null,"reasoning":"ipsum dolor "},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-sim-d79083ea","usage":{"prompt_tokens":9,"total_tokens":12,"completion_tokens":3,"prompt_tokens_details":null,"completion_tokens_details":{"reasoning_tokens":2}},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}`},
		{name: "stream with reasoning and usage", cfg: Config{ReasoningTokens: think}, body: `{` + user + `,"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`, want: `data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}

: sim-queue-ms=Q

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"reasoning":"ipsum "},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"reasoning":"dolor "},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"content":"elit "},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[],"usage":{"prompt_tokens":9,"total_tokens":12,"completion_tokens":3,"completion_tokens_details":{"reasoning_tokens":2}},"system_fingerprint":"vllm-sim-d79083ea"}

data: [DONE]

`},
		{name: "stream with reasoning_content", cfg: Config{ReasoningTokens: 1, ReasoningField: "reasoning_content"}, body: `{` + user + `,"max_tokens":2,"stream":true}`, want: `data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}

: sim-queue-ms=Q

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"reasoning_content":"ipsum "},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"content":"elit "},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}],"system_fingerprint":"vllm-sim-d79083ea"}

data: [DONE]

`},
		{name: "json with both reasoning fields", cfg: Config{ReasoningTokens: 1, ReasoningField: "both"}, body: `{` + user + `,"max_tokens":2}`, want: `{"id":"chatcmpl-ID","object":"chat.completion","created":0,"model":"tailgate-sim","choices":[{"index":0,"message":{"role":"assistant","content":"elit ","refusal":null,"annotations":null,"audio":null,"function_call":null,"reasoning":"ipsum ","reasoning_content":"ipsum "},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-sim-d79083ea","usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2,"prompt_tokens_details":null,"completion_tokens_details":{"reasoning_tokens":1}},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}`},
		{name: "stream with both reasoning fields", cfg: Config{ReasoningTokens: 1, ReasoningField: "both"}, body: `{` + user + `,"max_tokens":2,"stream":true}`, want: `data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}

: sim-queue-ms=Q

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"reasoning":"ipsum ","reasoning_content":"ipsum "},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"content":"elit "},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}],"system_fingerprint":"vllm-sim-d79083ea"}

data: [DONE]

`},
		{name: "json tool call", body: `{` + user + `,` + tool + `}`, want: `{"id":"chatcmpl-ID","object":"chat.completion","created":0,"model":"tailgate-sim","choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[{"id":"chatcmpl-tool-ID","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"elit incididunt\", \"days\": 84}"}}],"reasoning":null},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null,"token_ids":null,"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-sim-d79083ea","usage":{"prompt_tokens":9,"total_tokens":21,"completion_tokens":12,"prompt_tokens_details":null,"completion_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}`},
		{name: "json required tool call", body: `{` + user + `,` + tool + `,"tool_choice":"required"}`, want: `{"id":"chatcmpl-ID","object":"chat.completion","created":0,"model":"tailgate-sim","choices":[{"index":0,"message":{"role":"assistant","content":"","refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[{"id":"chatcmpl-tool-ID","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"elit incididunt\", \"days\": 84}"}}],"reasoning":null},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null,"token_ids":null,"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-sim-d79083ea","usage":{"prompt_tokens":9,"total_tokens":21,"completion_tokens":12,"prompt_tokens_details":null,"completion_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}`},
		{name: "json named tool call", body: `{` + user + `,` + tool + `,"tool_choice":{"type":"function","function":{"name":"get_weather"}}}`, want: `{"id":"chatcmpl-ID","object":"chat.completion","created":0,"model":"tailgate-sim","choices":[{"index":0,"message":{"role":"assistant","content":"","refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[{"id":"chatcmpl-tool-ID","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"elit incididunt\", \"days\": 84}"}}],"reasoning":null},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null,"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-sim-d79083ea","usage":{"prompt_tokens":9,"total_tokens":21,"completion_tokens":12,"prompt_tokens_details":null,"completion_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}`},
		{name: "stream tool call", body: `{` + user + `,` + tool + `,"stream":true}`, want: `data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}

: sim-queue-ms=Q

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-ID","type":"function","index":0,"function":{"name":"get_weather"}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"ci"}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ty\":"}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":" \"el"}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"it i"}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ncid"}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"idun"}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"t\", "}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"day"}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"s\": "}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"84}"}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null,"token_ids":null}],"system_fingerprint":"vllm-sim-d79083ea"}

data: [DONE]

`},
		{name: "stream tool call cut by max_tokens", body: `{` + user + `,` + tool + `,"max_tokens":3,"stream":true}`, want: `data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}

: sim-queue-ms=Q

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-ID","type":"function","index":0,"function":{"name":"get_weather"}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"ci"}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ty\":"}}]},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}],"system_fingerprint":"vllm-sim-d79083ea"}

data: [DONE]

`},
		{name: "json after a tool result", body: `{"messages":[{"role":"user","content":"hello"},{"role":"assistant","tool_calls":[{"id":"x","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},{"role":"tool","tool_call_id":"x","content":"sunny"}],` + tool + `,"max_tokens":2}`, want: `{"id":"chatcmpl-ID","object":"chat.completion","created":0,"model":"tailgate-sim","choices":[{"index":0,"message":{"role":"assistant","content":"elit adipiscing ","refusal":null,"annotations":null,"audio":null,"function_call":null,"reasoning":null},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-sim-d79083ea","usage":{"prompt_tokens":19,"total_tokens":21,"completion_tokens":2,"prompt_tokens_details":null,"completion_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}`},
		{name: "json n=2", body: `{` + user + `,"max_tokens":2,"n":2}`, want: `{"id":"chatcmpl-ID","object":"chat.completion","created":0,"model":"tailgate-sim","choices":[{"index":0,"message":{"role":"assistant","content":"elit incididunt ","refusal":null,"annotations":null,"audio":null,"function_call":null,"reasoning":null},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"routed_experts":null},{"index":1,"message":{"role":"assistant","content":"sed tempor ","refusal":null,"annotations":null,"audio":null,"function_call":null,"reasoning":null},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-sim-d79083ea","usage":{"prompt_tokens":9,"total_tokens":13,"completion_tokens":4,"prompt_tokens_details":null,"completion_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}`},
		{name: "stream n=2 with continuous usage", body: `{` + user + `,"max_tokens":2,"n":2,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, want: `data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":9,"total_tokens":9,"completion_tokens":0,"completion_tokens_details":null},"prompt_token_ids":null,"prompt_text":null}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":1,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":9,"total_tokens":9,"completion_tokens":0,"completion_tokens_details":null},"prompt_token_ids":null,"prompt_text":null}

: sim-queue-ms=Q

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"content":"elit "},"logprobs":null,"finish_reason":null,"token_ids":null}],"usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1,"completion_tokens_details":null}}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":1,"delta":{"content":"sed "},"logprobs":null,"finish_reason":null,"token_ids":null}],"usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1,"completion_tokens_details":null}}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":0,"delta":{"content":"incididunt "},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}],"usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2,"completion_tokens_details":null}}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[{"index":1,"delta":{"content":"tempor "},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}],"usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2,"completion_tokens_details":null}}

data: {"id":"chatcmpl-ID","object":"chat.completion.chunk","created":0,"model":"tailgate-sim","choices":[],"usage":{"prompt_tokens":9,"total_tokens":13,"completion_tokens":4},"system_fingerprint":"vllm-sim-d79083ea"}

data: [DONE]

`},
	} {
		c.path = "/v1/chat/completions"
		t.Run(c.name, c.run)
	}
}

// TestCompletionWire pins /v1/completions
// (vllm/entrypoints/openai/completion/protocol.py@002032ee, serving.py@030ea52e).
func TestCompletionWire(t *testing.T) {
	for _, c := range []wireCase{
		{name: "json", body: `{"prompt":"hello","max_tokens":2}`, want: `{"id":"cmpl-ID","object":"text_completion","created":0,"model":"tailgate-sim","choices":[{"index":0,"text":"elit incididunt ","logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null,"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-sim-d79083ea","usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,"prompt_tokens_details":null,"completion_tokens_details":null},"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}`},
		{name: "stream with usage", body: `{"prompt":"hello","max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`, want: `: sim-queue-ms=Q

data: {"id":"cmpl-ID","object":"text_completion","created":0,"model":"tailgate-sim","choices":[{"index":0,"text":"elit ","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}

data: {"id":"cmpl-ID","object":"text_completion","created":0,"model":"tailgate-sim","choices":[{"index":0,"text":"incididunt ","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}

data: {"id":"cmpl-ID","object":"text_completion","created":0,"model":"tailgate-sim","choices":[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2},"system_fingerprint":"vllm-sim-d79083ea"}

data: [DONE]

`},
		{name: "stream with continuous usage", body: `{"prompt":"hello","max_tokens":2,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, want: `: sim-queue-ms=Q

data: {"id":"cmpl-ID","object":"text_completion","created":0,"model":"tailgate-sim","choices":[{"index":0,"text":"elit ","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}

data: {"id":"cmpl-ID","object":"text_completion","created":0,"model":"tailgate-sim","choices":[{"index":0,"text":"incididunt ","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}

data: {"id":"cmpl-ID","object":"text_completion","created":0,"model":"tailgate-sim","choices":[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2},"system_fingerprint":"vllm-sim-d79083ea"}

data: [DONE]

`},
		{name: "json n=2", body: `{"prompt":"hello","max_tokens":1,"n":2}`, want: `{"id":"cmpl-ID","object":"text_completion","created":0,"model":"tailgate-sim","choices":[{"index":0,"text":"elit ","logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null,"routed_experts":null},{"index":1,"text":"sed ","logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null,"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-sim-d79083ea","usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,"prompt_tokens_details":null,"completion_tokens_details":null},"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}`},
	} {
		c.path = "/v1/completions"
		t.Run(c.name, c.run)
	}
}

// TestResponsesWire pins /v1/responses
// (vllm/entrypoints/openai/responses/protocol.py@c0bc5965, serving.py@0001948b,
// streaming_events.py@0d4d80b9).
func TestResponsesWire(t *testing.T) {
	const fn = `"tools":[{"type":"function","name":"get_weather","parameters":` + sample + `}]`
	for _, c := range []wireCase{
		{name: "json", body: `{"input":"hello","max_output_tokens":2}`, want: `{"id":"resp_ID","created_at":0,"incomplete_details":{"reason":"max_output_tokens"},"instructions":null,"metadata":null,"model":"tailgate-sim","object":"response","output":[{"id":"msg_ID","content":[{"annotations":[],"text":"elit incididunt ","type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message","phase":null}],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,"max_output_tokens":2,"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"incomplete","text":null,"top_logprobs":null,"truncation":"disabled","usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0,"input_tokens_per_turn":[9],"cached_tokens_per_turn":[0]},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[2],"tool_output_tokens_per_turn":[0]},"total_tokens":11},"user":null,"input_messages":null,"output_messages":null}`},
		{name: "json with instructions and options", body: `{"model":"tailgate-sim","instructions":"Be brief.","input":[{"role":"user","content":"hello"}],"temperature":0.5,"metadata":{"k": "v"}}`, want: `{"id":"resp_ID","created_at":0,"incomplete_details":null,"instructions":"Be brief.","metadata":{"k":"v"},"model":"tailgate-sim","object":"response","output":[{"id":"msg_ID","content":[{"annotations":[],"text":"lorem adipiscing eiusmod tempor sed tempor sit sit elit ut consectetur dolor sit ipsum sed sit ","type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message","phase":null}],"parallel_tool_calls":true,"temperature":0.5,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,"max_output_tokens":256,"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"completed","text":null,"top_logprobs":null,"truncation":"disabled","usage":{"input_tokens":16,"input_tokens_details":{"cached_tokens":0,"input_tokens_per_turn":[16],"cached_tokens_per_turn":[0]},"output_tokens":17,"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[17],"tool_output_tokens_per_turn":[0]},"total_tokens":33},"user":null,"input_messages":null,"output_messages":null}`},
		{name: "json with reasoning", cfg: Config{ReasoningTokens: think}, body: `{"input":"hello","max_output_tokens":3}`, want: `{"id":"resp_ID","created_at":0,"incomplete_details":{"reason":"max_output_tokens"},"instructions":null,"metadata":null,"model":"tailgate-sim","object":"response","output":[{"id":"msg_ID","summary":[],"type":"reasoning","content":[{"text":"ipsum dolor ","type":"reasoning_text"}],"encrypted_content":null,"status":"completed"},{"id":"msg_ID","content":[{"annotations":[],"text":"elit ","type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message","phase":null}],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,"max_output_tokens":3,"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"incomplete","text":null,"top_logprobs":null,"truncation":"disabled","usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0,"input_tokens_per_turn":[9],"cached_tokens_per_turn":[0]},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":2,"tool_output_tokens":0,"output_tokens_per_turn":[3],"tool_output_tokens_per_turn":[0]},"total_tokens":12},"user":null,"input_messages":null,"output_messages":null}`},
		{name: "json function call", body: `{"input":"hello",` + fn + `}`, want: `{"id":"resp_ID","created_at":0,"incomplete_details":null,"instructions":null,"metadata":null,"model":"tailgate-sim","object":"response","output":[{"arguments":"{\"city\": \"elit incididunt\", \"days\": 84}","call_id":"call_ID","name":"get_weather","type":"function_call","id":"fc_ID","caller":null,"namespace":null,"status":"completed"}],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto","tools":[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}],"top_p":1.0,"background":false,"max_output_tokens":256,"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"completed","text":null,"top_logprobs":null,"truncation":"disabled","usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0,"input_tokens_per_turn":[9],"cached_tokens_per_turn":[0]},"output_tokens":12,"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[12],"tool_output_tokens_per_turn":[0]},"total_tokens":21},"user":null,"input_messages":null,"output_messages":null}`},
		{name: "json after a function call output", body: `{"input":[{"role":"user","content":"hello"},{"type":"function_call","call_id":"c","name":"get_weather","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"sunny"}],` + fn + `,"max_output_tokens":2}`, want: `{"id":"resp_ID","created_at":0,"incomplete_details":{"reason":"max_output_tokens"},"instructions":null,"metadata":null,"model":"tailgate-sim","object":"response","output":[{"id":"msg_ID","content":[{"annotations":[],"text":"elit adipiscing ","type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message","phase":null}],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto","tools":[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}],"top_p":1.0,"background":false,"max_output_tokens":2,"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"incomplete","text":null,"top_logprobs":null,"truncation":"disabled","usage":{"input_tokens":15,"input_tokens_details":{"cached_tokens":0,"input_tokens_per_turn":[15],"cached_tokens_per_turn":[0]},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[2],"tool_output_tokens_per_turn":[0]},"total_tokens":17},"user":null,"input_messages":null,"output_messages":null}`},
		{name: "stream", body: `{"input":"hello","max_output_tokens":2,"stream":true}`, want: `event: response.created
data: {"response":{"id":"resp_ID","created_at":0,"incomplete_details":null,"instructions":null,"metadata":null,"model":"tailgate-sim","object":"response","output":[],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,"max_output_tokens":2,"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"in_progress","text":null,"top_logprobs":null,"truncation":"disabled","usage":null,"user":null,"input_messages":null,"output_messages":null},"sequence_number":0,"type":"response.created"}

event: response.in_progress
data: {"response":{"id":"resp_ID","created_at":0,"incomplete_details":null,"instructions":null,"metadata":null,"model":"tailgate-sim","object":"response","output":[],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,"max_output_tokens":2,"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"in_progress","text":null,"top_logprobs":null,"truncation":"disabled","usage":null,"user":null,"input_messages":null,"output_messages":null},"sequence_number":1,"type":"response.in_progress"}

: sim-queue-ms=Q

event: response.output_item.added
data: {"item":{"id":"msg_ID","content":[],"role":"assistant","status":"in_progress","type":"message","phase":null},"output_index":0,"sequence_number":2,"type":"response.output_item.added"}

event: response.content_part.added
data: {"content_index":0,"item_id":"msg_ID","output_index":0,"part":{"annotations":[],"text":"","type":"output_text","logprobs":[]},"sequence_number":3,"type":"response.content_part.added"}

event: response.output_text.delta
data: {"content_index":0,"delta":"elit ","item_id":"msg_ID","logprobs":[],"output_index":0,"sequence_number":4,"type":"response.output_text.delta"}

event: response.output_text.delta
data: {"content_index":0,"delta":"incididunt ","item_id":"msg_ID","logprobs":[],"output_index":0,"sequence_number":5,"type":"response.output_text.delta"}

event: response.output_text.done
data: {"content_index":0,"item_id":"msg_ID","logprobs":[],"output_index":0,"sequence_number":6,"text":"elit incididunt ","type":"response.output_text.done"}

event: response.content_part.done
data: {"content_index":0,"item_id":"msg_ID","output_index":0,"part":{"annotations":[],"text":"elit incididunt ","type":"output_text","logprobs":null},"sequence_number":7,"type":"response.content_part.done"}

event: response.output_item.done
data: {"item":{"id":"msg_ID","content":[{"annotations":[],"text":"elit incididunt ","type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message","phase":null},"output_index":0,"sequence_number":8,"type":"response.output_item.done"}

event: response.completed
data: {"response":{"id":"resp_ID","created_at":0,"incomplete_details":{"reason":"max_output_tokens"},"instructions":null,"metadata":null,"model":"tailgate-sim","object":"response","output":[{"id":"msg_ID","content":[{"annotations":[],"text":"elit incididunt ","type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message","phase":null}],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,"max_output_tokens":2,"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"incomplete","text":null,"top_logprobs":null,"truncation":"disabled","usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0,"input_tokens_per_turn":[9],"cached_tokens_per_turn":[0]},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[2],"tool_output_tokens_per_turn":[0]},"total_tokens":11},"user":null,"input_messages":null,"output_messages":null},"sequence_number":9,"type":"response.completed"}

`},
		{name: "stream with reasoning", cfg: Config{ReasoningTokens: 1}, body: `{"input":"hello","max_output_tokens":2,"stream":true}`, want: `event: response.created
data: {"response":{"id":"resp_ID","created_at":0,"incomplete_details":null,"instructions":null,"metadata":null,"model":"tailgate-sim","object":"response","output":[],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,"max_output_tokens":2,"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"in_progress","text":null,"top_logprobs":null,"truncation":"disabled","usage":null,"user":null,"input_messages":null,"output_messages":null},"sequence_number":0,"type":"response.created"}

event: response.in_progress
data: {"response":{"id":"resp_ID","created_at":0,"incomplete_details":null,"instructions":null,"metadata":null,"model":"tailgate-sim","object":"response","output":[],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,"max_output_tokens":2,"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"in_progress","text":null,"top_logprobs":null,"truncation":"disabled","usage":null,"user":null,"input_messages":null,"output_messages":null},"sequence_number":1,"type":"response.in_progress"}

: sim-queue-ms=Q

event: response.output_item.added
data: {"item":{"id":"msg_ID","summary":[],"type":"reasoning","content":null,"encrypted_content":null,"status":"in_progress"},"output_index":0,"sequence_number":2,"type":"response.output_item.added"}

event: response.reasoning_part.added
data: {"content_index":0,"item_id":"msg_ID","output_index":0,"part":{"text":"","type":"reasoning_text"},"sequence_number":3,"type":"response.reasoning_part.added"}

event: response.reasoning_text.delta
data: {"content_index":0,"delta":"ipsum ","item_id":"msg_ID","output_index":0,"sequence_number":4,"type":"response.reasoning_text.delta"}

event: response.reasoning_text.done
data: {"content_index":0,"item_id":"msg_ID","output_index":0,"sequence_number":5,"text":"ipsum ","type":"response.reasoning_text.done"}

event: response.reasoning_part.done
data: {"content_index":0,"item_id":"msg_ID","output_index":0,"part":{"text":"ipsum ","type":"reasoning_text"},"sequence_number":6,"type":"response.reasoning_part.done"}

event: response.output_item.done
data: {"item":{"id":"msg_ID","summary":[],"type":"reasoning","content":[{"text":"ipsum ","type":"reasoning_text"}],"encrypted_content":null,"status":"completed"},"output_index":0,"sequence_number":7,"type":"response.output_item.done"}

event: response.output_item.added
data: {"item":{"id":"msg_ID","content":[],"role":"assistant","status":"in_progress","type":"message","phase":null},"output_index":1,"sequence_number":8,"type":"response.output_item.added"}

event: response.content_part.added
data: {"content_index":0,"item_id":"msg_ID","output_index":1,"part":{"annotations":[],"text":"","type":"output_text","logprobs":[]},"sequence_number":9,"type":"response.content_part.added"}

event: response.output_text.delta
data: {"content_index":0,"delta":"elit ","item_id":"msg_ID","logprobs":[],"output_index":1,"sequence_number":10,"type":"response.output_text.delta"}

event: response.output_text.done
data: {"content_index":0,"item_id":"msg_ID","logprobs":[],"output_index":1,"sequence_number":11,"text":"elit ","type":"response.output_text.done"}

event: response.content_part.done
data: {"content_index":0,"item_id":"msg_ID","output_index":1,"part":{"annotations":[],"text":"elit ","type":"output_text","logprobs":null},"sequence_number":12,"type":"response.content_part.done"}

event: response.output_item.done
data: {"item":{"id":"msg_ID","content":[{"annotations":[],"text":"elit ","type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message","phase":null},"output_index":1,"sequence_number":13,"type":"response.output_item.done"}

event: response.completed
data: {"response":{"id":"resp_ID","created_at":0,"incomplete_details":{"reason":"max_output_tokens"},"instructions":null,"metadata":null,"model":"tailgate-sim","object":"response","output":[{"id":"msg_ID","summary":[],"type":"reasoning","content":[{"text":"ipsum ","type":"reasoning_text"}],"encrypted_content":null,"status":"completed"},{"id":"msg_ID","content":[{"annotations":[],"text":"elit ","type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message","phase":null}],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,"max_output_tokens":2,"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"incomplete","text":null,"top_logprobs":null,"truncation":"disabled","usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0,"input_tokens_per_turn":[9],"cached_tokens_per_turn":[0]},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":1,"tool_output_tokens":0,"output_tokens_per_turn":[2],"tool_output_tokens_per_turn":[0]},"total_tokens":11},"user":null,"input_messages":null,"output_messages":null},"sequence_number":14,"type":"response.completed"}

`},
		{name: "stream function call", body: `{"input":"hello",` + fn + `,"tool_choice":"required","max_output_tokens":4,"stream":true}`, want: `event: response.created
data: {"response":{"id":"resp_ID","created_at":0,"incomplete_details":null,"instructions":null,"metadata":null,"model":"tailgate-sim","object":"response","output":[],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"required","tools":[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}],"top_p":1.0,"background":false,"max_output_tokens":4,"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"in_progress","text":null,"top_logprobs":null,"truncation":"disabled","usage":null,"user":null,"input_messages":null,"output_messages":null},"sequence_number":0,"type":"response.created"}

event: response.in_progress
data: {"response":{"id":"resp_ID","created_at":0,"incomplete_details":null,"instructions":null,"metadata":null,"model":"tailgate-sim","object":"response","output":[],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"required","tools":[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}],"top_p":1.0,"background":false,"max_output_tokens":4,"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"in_progress","text":null,"top_logprobs":null,"truncation":"disabled","usage":null,"user":null,"input_messages":null,"output_messages":null},"sequence_number":1,"type":"response.in_progress"}

: sim-queue-ms=Q

event: response.output_item.added
data: {"item":{"arguments":"","call_id":"call_ID","name":"get_weather","type":"function_call","id":"fc_ID","caller":null,"namespace":null,"status":"in_progress"},"output_index":0,"sequence_number":2,"type":"response.output_item.added"}

event: response.function_call_arguments.delta
data: {"delta":"{\"ci","item_id":"fc_ID","output_index":0,"sequence_number":3,"type":"response.function_call_arguments.delta"}

event: response.function_call_arguments.delta
data: {"delta":"ty\":","item_id":"fc_ID","output_index":0,"sequence_number":4,"type":"response.function_call_arguments.delta"}

event: response.function_call_arguments.delta
data: {"delta":" \"el","item_id":"fc_ID","output_index":0,"sequence_number":5,"type":"response.function_call_arguments.delta"}

event: response.function_call_arguments.done
data: {"arguments":"{\"city\": \"el","item_id":"fc_ID","name":"get_weather","output_index":0,"sequence_number":6,"type":"response.function_call_arguments.done"}

event: response.output_item.done
data: {"item":{"arguments":"{\"city\": \"el","call_id":"call_ID","name":"get_weather","type":"function_call","id":"fc_ID","caller":null,"namespace":null,"status":"completed"},"output_index":0,"sequence_number":7,"type":"response.output_item.done"}

event: response.completed
data: {"response":{"id":"resp_ID","created_at":0,"incomplete_details":{"reason":"max_output_tokens"},"instructions":null,"metadata":null,"model":"tailgate-sim","object":"response","output":[{"arguments":"{\"city\": \"el","call_id":"call_ID","name":"get_weather","type":"function_call","id":"fc_ID","caller":null,"namespace":null,"status":"completed"}],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"required","tools":[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}],"top_p":1.0,"background":false,"max_output_tokens":4,"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"incomplete","text":null,"top_logprobs":null,"truncation":"disabled","usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0,"input_tokens_per_turn":[9],"cached_tokens_per_turn":[0]},"output_tokens":4,"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[4],"tool_output_tokens_per_turn":[0]},"total_tokens":13},"user":null,"input_messages":null,"output_messages":null},"sequence_number":8,"type":"response.completed"}

`},
		{name: "previous response", status: 404, body: `{"input":"hello","previous_response_id":"resp_1"}`, want: `{"error":{"message":"Response with id 'resp_1' not found.","type":"invalid_request_error","param":"response_id","code":404}}`},
	} {
		c.path = "/v1/responses"
		t.Run(c.name, c.run)
	}
}

// TestMessagesWire pins /v1/messages (vllm/entrypoints/anthropic/protocol.py@82df3f49,
// serving.py@82df3f49, api_router.py@42fa4c09).
func TestMessagesWire(t *testing.T) {
	const msgs = `"model":"tailgate-sim","messages":[{"role":"user","content":"hello"}]`
	const tools = `"tools":[{"name":"get_weather","input_schema":` + sample + `}]`
	for _, c := range []wireCase{
		{name: "json", body: `{` + msgs + `,"max_tokens":2}`, want: `{"id":"chatcmpl-ID","type":"message","role":"assistant","content":[{"type":"text","text":"elit incididunt "}],"model":"tailgate-sim","stop_reason":"max_tokens","usage":{"input_tokens":9,"output_tokens":2}}`},
		{name: "json with thinking and system", cfg: Config{ReasoningTokens: 1}, body: `{` + msgs + `,"system":"Be brief.","max_tokens":2}`, want: `{"id":"chatcmpl-ID","type":"message","role":"assistant","content":[{"type":"thinking","thinking":"amet ","signature":"SIG"},{"type":"text","text":"lorem "}],"model":"tailgate-sim","stop_reason":"max_tokens","usage":{"input_tokens":16,"output_tokens":2}}`},
		{name: "json tool use", body: `{` + msgs + `,` + tools + `,"max_tokens":50}`, want: `{"id":"chatcmpl-ID","type":"message","role":"assistant","content":[{"type":"tool_use","id":"chatcmpl-tool-ID","name":"get_weather","input":{"city":"elit incididunt","days":84}}],"model":"tailgate-sim","stop_reason":"tool_use","usage":{"input_tokens":9,"output_tokens":12}}`},
		{name: "stream", body: `{` + msgs + `,"max_tokens":2,"stream":true}`, want: `event: message_start
data: {"type":"message_start","message":{"id":"chatcmpl-ID","content":[],"model":"tailgate-sim","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":0}}}

: sim-queue-ms=Q

event: content_block_start
data: {"type":"content_block_start","content_block":{"type":"text","text":""},"index":0}

event: content_block_delta
data: {"type":"content_block_delta","delta":{"type":"text_delta","text":"elit "},"index":0}

event: content_block_delta
data: {"type":"content_block_delta","delta":{"type":"text_delta","text":"incididunt "},"index":0}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":9,"output_tokens":2}}

event: message_stop
data: {"type":"message_stop"}

data: [DONE]

`},
		{name: "stream with thinking", cfg: Config{ReasoningTokens: 1}, body: `{` + msgs + `,"max_tokens":2,"stream":true}`, want: `event: message_start
data: {"type":"message_start","message":{"id":"chatcmpl-ID","content":[],"model":"tailgate-sim","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":0}}}

: sim-queue-ms=Q

event: content_block_start
data: {"type":"content_block_start","content_block":{"type":"thinking","thinking":""},"index":0}

event: content_block_delta
data: {"type":"content_block_delta","delta":{"type":"thinking_delta","thinking":"ipsum "},"index":0}

event: content_block_delta
data: {"type":"content_block_delta","delta":{"type":"signature_delta","signature":"SIG"},"index":0}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","content_block":{"type":"text","text":""},"index":1}

event: content_block_delta
data: {"type":"content_block_delta","delta":{"type":"text_delta","text":"elit "},"index":1}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":9,"output_tokens":2}}

event: message_stop
data: {"type":"message_stop"}

data: [DONE]

`},
		{name: "stream tool use", body: `{` + msgs + `,` + tools + `,"tool_choice":{"type":"any"},"max_tokens":4,"stream":true}`, want: `event: message_start
data: {"type":"message_start","message":{"id":"chatcmpl-ID","content":[],"model":"tailgate-sim","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":0}}}

: sim-queue-ms=Q

event: content_block_start
data: {"type":"content_block_start","content_block":{"type":"tool_use","id":"chatcmpl-tool-ID","name":"get_weather","input":{}},"index":0}

event: content_block_delta
data: {"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":"{\"ci"},"index":0}

event: content_block_delta
data: {"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":"ty\":"},"index":0}

event: content_block_delta
data: {"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":" \"el"},"index":0}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":9,"output_tokens":4}}

event: message_stop
data: {"type":"message_stop"}

data: [DONE]

`},
		{name: "unknown model", status: 404, body: `{"model":"other","messages":[{"role":"user","content":"hello"}],"max_tokens":2}`, want: "{\"type\":\"error\",\"error\":{\"type\":\"NotFoundError\",\"message\":\"The model `other` does not exist.\"}}"},
		{name: "max_tokens missing", status: 400, body: `{` + msgs + `}`, want: `{"error":{"message":"1 validation error:\n  {'type': 'missing', 'loc': 'body.max_tokens', 'msg': 'Field required', 'input': '<dict of 2 items>'}","type":"Bad Request","param":"body.max_tokens","code":400}}`},
	} {
		c.path = "/v1/messages"
		t.Run(c.name, c.run)
	}
}
