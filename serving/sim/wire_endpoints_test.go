package sim

import "testing"

// TestPoolingWire pins /v1/embeddings, rerank and score
// (vllm/entrypoints/pooling/embed/protocol.py@ff8d577a,
// pooling/scoring/protocol.py@004706d8, scoring/api_router.py@facb56e2).
func TestPoolingWire(t *testing.T) {
	small := Config{EmbeddingDim: 3}
	const rerank = `{"query":"what is up","documents":["up","down","sideways"],"top_n":2}`
	const score = `{"queries":"what is up","documents":["up","down"]}`
	for _, c := range []wireCase{
		{name: "embeddings", cfg: small, path: "/v1/embeddings", body: `{"input":["hello","world"]}`, want: `{"id":"embd-ID","object":"list","created":0,"model":"tailgate-sim","data":[{"index":0,"object":"embedding","embedding":[0.30964624881744385,-0.9299271106719971,-0.19838036596775055]},{"index":1,"object":"embedding","embedding":[-0.053157027810811996,-0.18003346025943756,0.9822231531143188]}],"usage":{"prompt_tokens":6,"total_tokens":6,"completion_tokens":0,"prompt_tokens_details":null,"completion_tokens_details":null}}`},
		{name: "embeddings base64 and dimensions", cfg: small, path: "/v1/embeddings", body: `{"input":"hello","encoding_format":"base64","dimensions":2}`, want: `{"id":"embd-ID","object":"list","created":0,"model":"tailgate-sim","data":[{"index":0,"object":"embedding","embedding":"9MChPoTjcr8="}],"usage":{"prompt_tokens":3,"total_tokens":3,"completion_tokens":0,"prompt_tokens_details":null,"completion_tokens_details":null}}`},
		{name: "embeddings of token ids", cfg: small, path: "/v1/embeddings", body: `{"input":[1,2,3]}`, want: `{"id":"embd-ID","object":"list","created":0,"model":"tailgate-sim","data":[{"index":0,"object":"embedding","embedding":[0.6167190670967102,-0.11329499632120132,0.77898770570755]}],"usage":{"prompt_tokens":3,"total_tokens":3,"completion_tokens":0,"prompt_tokens_details":null,"completion_tokens_details":null}}`},
		{name: "v1 rerank", path: "/v1/rerank", body: rerank, want: `{"id":"rerank-ID","model":"tailgate-sim","usage":{"prompt_tokens":22,"total_tokens":22},"results":[{"index":0,"document":{"text":"up","multi_modal":null},"relevance_score":0.7936371181112715},{"index":2,"document":{"text":"sideways","multi_modal":null},"relevance_score":0.5998411967672873}]}`},
		{name: "rerank", path: "/rerank", body: rerank, want: `{"id":"rerank-ID","model":"tailgate-sim","usage":{"prompt_tokens":22,"total_tokens":22},"results":[{"index":0,"document":{"text":"up","multi_modal":null},"relevance_score":0.7936371181112715},{"index":2,"document":{"text":"sideways","multi_modal":null},"relevance_score":0.5998411967672873}]}`},
		{name: "v2 rerank", path: "/v2/rerank", body: rerank, want: `{"id":"rerank-ID","model":"tailgate-sim","usage":{"prompt_tokens":22,"total_tokens":22},"results":[{"index":0,"document":{"text":"up","multi_modal":null},"relevance_score":0.7936371181112715},{"index":2,"document":{"text":"sideways","multi_modal":null},"relevance_score":0.5998411967672873}]}`},
		{name: "v1 score", path: "/v1/score", body: score, want: `{"id":"score-ID","object":"list","created":0,"model":"tailgate-sim","data":[{"index":0,"object":"score","score":0.7936371181112715},{"index":1,"object":"score","score":0.19759842216502874}],"usage":{"prompt_tokens":14,"total_tokens":14,"completion_tokens":0,"prompt_tokens_details":null,"completion_tokens_details":null}}`},
		{name: "score text_1 text_2", path: "/score", body: `{"text_1":["a","b"],"text_2":["c","d"]}`, want: `{"id":"score-ID","object":"list","created":0,"model":"tailgate-sim","data":[{"index":0,"object":"score","score":0.4159025351104792},{"index":1,"object":"score","score":0.07967101598028094}],"usage":{"prompt_tokens":10,"total_tokens":10,"completion_tokens":0,"prompt_tokens_details":null,"completion_tokens_details":null}}`},
		{name: "score mismatched", status: 400, path: "/score", body: `{"text_1":["a","b"],"text_2":["c","d","e"]}`, want: `{"error":{"message":"Input lengths must be either 1:1, 1:N or N:N","type":"BadRequestError","param":null,"code":400}}`},
	} {
		t.Run(c.name, c.run)
	}
}

// TestTokenizeWire pins /tokenize and /detokenize
// (vllm/entrypoints/serve/tokenize/protocol.py@343bacaf).
func TestTokenizeWire(t *testing.T) {
	for _, c := range []wireCase{
		{name: "prompt", path: "/tokenize", body: `{"prompt":"hello world"}`, want: `{"count":4,"max_model_len":32768,"tokens":[1,1768320380,1881241727,7564660],"token_strs":null}`},
		{name: "prompt without special tokens, with strings", path: "/tokenize", body: `{"prompt":"hello world","add_special_tokens":false,"return_token_strs":true}`, want: `{"count":3,"max_model_len":32768,"tokens":[1768320380,1881241727,7564660],"token_strs":["hell","o wo","rld"]}`},
		{name: "messages", path: "/tokenize", body: `{` + user + `}`, want: `{"count":9,"max_model_len":32768,"tokens":[2,6,4,1768320380,127,3,2,7,4],"token_strs":null}`},
		{name: "detokenize", path: "/detokenize", body: `{"tokens":[1,1768320380,1881241727,7564660]}`, want: `{"prompt":"<s>hello world"}`},
		{name: "detokenize outside the vocabulary", status: 400, path: "/detokenize", body: `{"tokens":[12]}`, want: `{"error":{"message":"token id 12 is outside the simulated vocabulary (1 to 4311810319)","type":"BadRequestError","param":"tokens","code":400}}`},
	} {
		t.Run(c.name, c.run)
	}
}

// TestAudioWire pins /v1/audio/transcriptions and /translations
// (vllm/entrypoints/openai/speech_to_text/protocol.py@79ef6467, speech_to_text.py@024e0772).
func TestAudioWire(t *testing.T) {
	form := func(fields ...string) (string, string) { return multipartForm(t, wav(1.5), fields...) }
	jsonForm, jsonCT := form("model", "tailgate-sim")
	textForm, textCT := form("response_format", "text")
	streamForm, streamCT := form("stream", "true", "stream_include_usage", "true")
	strayForm, strayCT := multipartForm(t, nil, "file", "not a file")
	for _, c := range []wireCase{
		{name: "transcription", path: "/v1/audio/transcriptions", body: jsonForm, ctype: jsonCT, want: `{"text":"lorem incididunt consectetur ","usage":{"type":"duration","seconds":2}}`},
		{name: "translation", path: "/v1/audio/translations", body: jsonForm, ctype: jsonCT, want: `{"text":"lorem incididunt consectetur "}`},
		{name: "transcription as text", path: "/v1/audio/transcriptions", body: textForm, ctype: textCT, want: `lorem incididunt consectetur `},
		{name: "transcription stream", path: "/v1/audio/transcriptions", body: streamForm, ctype: streamCT, want: `: sim-queue-ms=Q

data: {"id":"trsc-ID","object":"transcription.chunk","created":0,"model":"tailgate-sim","choices":[{"delta":{"content":"lorem "}}]}

data: {"id":"trsc-ID","object":"transcription.chunk","created":0,"model":"tailgate-sim","choices":[{"delta":{"content":"incididunt "}}]}

data: {"id":"trsc-ID","object":"transcription.chunk","created":0,"model":"tailgate-sim","choices":[{"delta":{"content":"consectetur "},"finish_reason":"stop","stop_reason":null}]}

data: {"id":"trsc-ID","object":"transcription.chunk","created":0,"model":"tailgate-sim","choices":[],"usage":{"prompt_tokens":101,"total_tokens":104,"completion_tokens":3}}

data: [DONE]

`},
		{name: "translation stream", path: "/v1/audio/translations", body: streamForm, ctype: streamCT, want: `: sim-queue-ms=Q

data: {"id":"trsl-ID","object":"translation.chunk","created":0,"model":"tailgate-sim","choices":[{"delta":{"content":"lorem "}}]}

data: {"id":"trsl-ID","object":"translation.chunk","created":0,"model":"tailgate-sim","choices":[{"delta":{"content":"incididunt "}}]}

data: {"id":"trsl-ID","object":"translation.chunk","created":0,"model":"tailgate-sim","choices":[{"delta":{"content":"consectetur "},"finish_reason":"stop","stop_reason":null}]}

data: {"id":"trsl-ID","object":"translation.chunk","created":0,"model":"tailgate-sim","choices":[],"usage":{"prompt_tokens":101,"total_tokens":104,"completion_tokens":3}}

data: [DONE]

`},
		{name: "file as a string", status: 422, path: "/v1/audio/transcriptions", body: strayForm, ctype: strayCT, want: `{"error":{"message":"Expected 'file' to be a file-like object, not 'str'.","type":"Unprocessable Entity","param":null,"code":422}}`},
	} {
		t.Run(c.name, c.run)
	}
}

// TestValidationErrorWire pins vLLM's 400 for bodies pydantic refuses
// (vllm/entrypoints/serve/exception_handling/handlers/validation.py@4da14a5c)
// and for a wrong Content-Type (validate_json_request).
func TestValidationErrorWire(t *testing.T) {
	for _, c := range []wireCase{
		{name: "temperature a word", body: `{` + user + `,"temperature":"hot"}`, want: `{"error":{"message":"1 validation error:\n  {'type': 'float_parsing', 'loc': 'body.temperature', 'msg': 'Input should be a valid number, unable to parse string as a number', 'input': 'hot'}","type":"Bad Request","param":"body.temperature","code":400}}`},
		{name: "several wrong types", body: `{` + user + `,"stop":5,"top_p":[0.5],"n":1.5,"stream":"often"}`, want: `{"error":{"message":"5 validation errors:\n  {'type': 'int_from_float', 'loc': 'body.n', 'msg': 'Input should be a valid integer, got a number with a fractional part', 'input': '1.5'}\n  {'type': 'string_type', 'loc': 'body.stop', 'msg': 'Input should be a valid string', 'input': '5'}\n  {'type': 'list_type', 'loc': 'body.stop', 'msg': 'Input should be a valid list', 'input': '5'}\n  {'type': 'bool_parsing', 'loc': 'body.stream', 'msg': 'Input should be a valid boolean, unable to interpret input', 'input': 'often'}\n  {'type': 'float_type', 'loc': 'body.top_p', 'msg': 'Input should be a valid number', 'input': '<list of 1 items>'}","type":"Bad Request","param":"body.n","code":400}}`},
		{name: "lax values are accepted", status: 200, body: `{` + user + `,"temperature":"0.5","max_tokens":"1","stream":"no","n":1.0,"ignore_eos":1}`, want: `{"id":"chatcmpl-ID","object":"chat.completion","created":0,"model":"tailgate-sim","choices":[{"index":0,"message":{"role":"assistant","content":"elit ","refusal":null,"annotations":null,"audio":null,"function_call":null,"reasoning":null},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-sim-d79083ea","usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1,"prompt_tokens_details":null,"completion_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}`},
		{name: "missing messages", body: `{"model":"tailgate-sim"}`, want: `{"error":{"message":"1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required', 'input': '<dict of 1 items>'}","type":"Bad Request","param":"body.messages","code":400}}`},
		{name: "invalid JSON", body: `{"messages":`, want: `{"error":{"message":"1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.12', 'msg': 'JSON decode error', 'input': '<dict of 0 items>', 'ctx': {'error': 'Expecting value'}}","type":"Bad Request","param":"body.12","code":400}}`},
		{name: "stream_options without stream", body: `{` + user + `,"stream_options":{"include_usage":true}}`, want: "{\"error\":{\"message\":\"1 validation error:\\n  {'type': 'value_error', 'loc': 'body', 'msg': 'Value error, Stream options can only be defined when `stream=True`. (parameter=stream_options)', 'input': '<dict of 2 items>', 'ctx': {'error': VLLMValidationError('Stream options can only be defined when `stream=True`.')}}\",\"type\":\"Bad Request\",\"param\":\"stream_options\",\"code\":400}}"},
		{name: "stream_options of the wrong type", body: `{` + user + `,"stream":true,"stream_options":{"include_usage":"maybe"}}`, want: `{"error":{"message":"1 validation error:\n  {'type': 'bool_parsing', 'loc': 'body.stream_options.include_usage', 'msg': 'Input should be a valid boolean, unable to interpret input', 'input': 'maybe'}","type":"Bad Request","param":"body.stream_options.include_usage","code":400}}`},
		{name: "tool_choice unknown", body: `{` + user + `,` + tool + `,"tool_choice":"sometimes"}`, want: "{\"error\":{\"message\":\"1 validation error:\\n  {'type': 'value_error', 'loc': 'body', 'msg': 'Value error, Invalid value for `tool_choice`: sometimes! Only named tools, \\\"none\\\", \\\"auto\\\" or \\\"required\\\" are supported. (parameter=tool_choice)', 'input': '<dict of 3 items>', 'ctx': {'error': VLLMValidationError('Invalid value for `tool_choice`: sometimes! Only named tools, \\\"none\\\", \\\"auto\\\" or \\\"required\\\" are supported.')}}\",\"type\":\"Bad Request\",\"param\":\"tool_choice\",\"code\":400}}"},
		{name: "named tool not offered", body: `{` + user + `,` + tool + `,"tool_choice":{"type":"function","function":{"name":"other"}}}`, want: "{\"error\":{\"message\":\"1 validation error:\\n  {'type': 'value_error', 'loc': 'body', 'msg': 'Value error, The tool specified in `tool_choice` does not match any of the specified `tools` (parameter=tool_choice)', 'input': '<dict of 3 items>', 'ctx': {'error': VLLMValidationError('The tool specified in `tool_choice` does not match any of the specified `tools`')}}\",\"type\":\"Bad Request\",\"param\":\"tool_choice\",\"code\":400}}"},
		{name: "wrong content type", ctype: "text/plain", body: `{` + user + `}`, want: `{"error":{"message":"1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed","type":"Bad Request","param":null,"code":400}}`},
	} {
		c.path = "/v1/chat/completions"
		if c.status == 0 {
			c.status = 400
		}
		t.Run(c.name, c.run)
	}
}
