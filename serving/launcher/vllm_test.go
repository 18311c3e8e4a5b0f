package launcher

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestVLLMCommandBuildsServeLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		opts     VLLMOptions
		wantArgs []string // after argv[0]
		wantEnv  []string
	}{
		{
			name:     "model only",
			opts:     VLLMOptions{Model: "Qwen/Qwen2.5-0.5B-Instruct"},
			wantArgs: []string{"serve", "Qwen/Qwen2.5-0.5B-Instruct", "--uds", "/run/e/engine.sock"},
			wantEnv:  []string{"VLLM_NO_USAGE_STATS=1", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE=5"},
		},
		{
			name: "every flag",
			opts: VLLMOptions{
				Model: "meta-llama/Llama-3.1-8B-Instruct", ServedModelName: "llama", GPUs: "0,1",
				TensorParallelSize: 2, MaxNumSeqs: 64, MaxNumBatchedTokens: 8192, GPUMemoryUtilization: 0.9,
				ExtraArgs: []string{"--enable-prefix-caching", "--max-model-len", "4096"},
			},
			wantArgs: []string{"serve", "meta-llama/Llama-3.1-8B-Instruct", "--uds", "/run/e/engine.sock",
				"--served-model-name", "llama", "--tensor-parallel-size", "2", "--max-num-seqs", "64",
				"--max-num-batched-tokens", "8192", "--gpu-memory-utilization", "0.9",
				"--enable-prefix-caching", "--max-model-len", "4096"},
			wantEnv: []string{"VLLM_NO_USAGE_STATS=1", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE=5", "CUDA_VISIBLE_DEVICES=0,1"},
		},
		{
			name:     "gpus without tensor parallelism",
			opts:     VLLMOptions{Model: "/models/m", GPUs: "3"},
			wantArgs: []string{"serve", "/models/m", "--uds", "/run/e/engine.sock"},
			wantEnv:  []string{"VLLM_NO_USAGE_STATS=1", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE=5", "CUDA_VISIBLE_DEVICES=3"},
		},
		{
			name:     "full memory and extra args only",
			opts:     VLLMOptions{Model: "m", GPUMemoryUtilization: 1, ExtraArgs: []string{"--dtype=half"}},
			wantArgs: []string{"serve", "m", "--uds", "/run/e/engine.sock", "--gpu-memory-utilization", "1", "--dtype=half"},
			wantEnv:  []string{"VLLM_NO_USAGE_STATS=1", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE=5"},
		},
		{
			name:     "traces to a collector",
			opts:     VLLMOptions{Model: "m", OTLPTracesEndpoint: "http://collector:4318/v1/traces", ExtraArgs: []string{"--dtype=half"}},
			wantArgs: []string{"serve", "m", "--uds", "/run/e/engine.sock", "--otlp-traces-endpoint", "http://collector:4318/v1/traces", "--dtype=half"},
			wantEnv: []string{"VLLM_NO_USAGE_STATS=1", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE=5",
				"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf", "OTEL_SERVICE_NAME=vllm"},
		},
		{
			name:     "sleep mode for the fleet controller",
			opts:     VLLMOptions{Model: "m", SleepMode: true, ExtraArgs: []string{"--dtype=half"}},
			wantArgs: []string{"serve", "m", "--uds", "/run/e/engine.sock", "--enable-sleep-mode", "--dtype=half"},
			wantEnv:  []string{"VLLM_NO_USAGE_STATS=1", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE=5", "VLLM_SERVER_DEV_MODE=1"},
		},
		{
			name:     "priority scheduling the gateway knows of",
			opts:     VLLMOptions{Model: "m", PriorityScheduling: true},
			wantArgs: []string{"serve", "m", "--uds", "/run/e/engine.sock", "--scheduling-policy", "priority"},
			wantEnv:  []string{"VLLM_NO_USAGE_STATS=1", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE=5"},
		},
		{
			name:     "explicit binary",
			opts:     VLLMOptions{Binary: fakeVLLM, Model: "m", MaxNumSeqs: 1},
			wantArgs: []string{"serve", "m", "--uds", "/run/e/engine.sock", "--max-num-seqs", "1"},
			wantEnv:  []string{"VLLM_NO_USAGE_STATS=1", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE=5"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			argv, env, err := VLLMCommand(tt.opts, "/run/e/engine.sock")
			if err != nil {
				t.Fatal(err)
			}
			if argv[0] != fakeVLLM {
				t.Errorf("argv[0] = %q, want the vllm on PATH %q", argv[0], fakeVLLM)
			}
			if !slices.Equal(argv[1:], tt.wantArgs) {
				t.Errorf("args:\n got %q\nwant %q", argv[1:], tt.wantArgs)
			}
			if !slices.Equal(env, tt.wantEnv) {
				t.Errorf("env = %q, want %q", env, tt.wantEnv)
			}
		})
	}
}

func TestVLLMCommandRejectsBadOptions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		opts VLLMOptions
		sock string
		want string
	}{
		{"no model", VLLMOptions{}, "/e.sock", "a model is required"},
		{"negative tensor parallelism", VLLMOptions{Model: "m", TensorParallelSize: -1}, "/e.sock", "--tensor-parallel-size"},
		{"negative max seqs", VLLMOptions{Model: "m", MaxNumSeqs: -1}, "/e.sock", "--max-num-seqs"},
		{"negative batched tokens", VLLMOptions{Model: "m", MaxNumBatchedTokens: -1}, "/e.sock", "--max-num-batched-tokens"},
		{"utilization above one", VLLMOptions{Model: "m", GPUMemoryUtilization: 1.5}, "/e.sock", "--gpu-memory-utilization must be in (0, 1]"},
		{"negative utilization", VLLMOptions{Model: "m", GPUMemoryUtilization: -0.5}, "/e.sock", "--gpu-memory-utilization"},
		{"NaN utilization", VLLMOptions{Model: "m", GPUMemoryUtilization: math.NaN()}, "/e.sock", "--gpu-memory-utilization"},
		{"missing explicit binary", VLLMOptions{Binary: "/nonexistent/bin/vllm", Model: "m"}, "/e.sock", "/nonexistent/bin/vllm"},
		{"no socket", VLLMOptions{Model: "m"}, "", "no socket path"},
		{"scheduling policy behind the gateway's back", VLLMOptions{Model: "m", ExtraArgs: []string{"--scheduling-policy=priority"}}, "/e.sock", "--engine-priority-scheduling"},
		{"own api key", VLLMOptions{Model: "m", ExtraArgs: []string{"--api-key", "k"}}, "/e.sock",
			"vllm: --vllm-arg --api-key: the API key is the launcher's: each engine start gets a random one that only the sidecar sends; clients use tailgate API keys at the gateway"},
		{"own api key with =", VLLMOptions{Model: "m", ExtraArgs: []string{"--api-key=k"}}, "/e.sock", "--vllm-arg --api-key: the API key is the launcher's"},
		{"own api key with underscore", VLLMOptions{Model: "m", ExtraArgs: []string{"--api_key=k"}}, "/e.sock", "--vllm-arg --api-key: the API key is the launcher's"},
		{"served name", VLLMOptions{Model: "m", ExtraArgs: []string{"--served-model-name", "x"}}, "/e.sock",
			"vllm: --vllm-arg --served-model-name: use tailgate worker's --served-model-name instead (readiness waits for that name; tailgate up serves --model as named)"},
		{"served name with =", VLLMOptions{Model: "m", ExtraArgs: []string{"--enforce-eager", "--served-model-name=x"}}, "/e.sock", "--vllm-arg --served-model-name: use tailgate worker's --served-model-name"},
		{"served name with underscores", VLLMOptions{Model: "m", ExtraArgs: []string{"--served_model_name", "x"}}, "/e.sock", "--vllm-arg --served-model-name: use"},
		{"port", VLLMOptions{Model: "m", ExtraArgs: []string{"--port=9"}}, "/e.sock",
			"vllm: --vllm-arg --port: the launcher binds the engine to a Unix socket only the worker can open; the gateway reaches the worker at --listen / --advertise"},
		{"port as two args", VLLMOptions{Model: "m", ExtraArgs: []string{"--port", "9"}}, "/e.sock", "--vllm-arg --port: the launcher binds"},
		{"port and value in one arg", VLLMOptions{Model: "m", ExtraArgs: []string{"--port 9"}}, "/e.sock", "--vllm-arg --port: the launcher binds"},
		{"host", VLLMOptions{Model: "m", ExtraArgs: []string{"--host", "0.0.0.0"}}, "/e.sock", "--vllm-arg --host: the launcher binds"},
		{"unix socket", VLLMOptions{Model: "m", ExtraArgs: []string{"--uds=/tmp/v.sock"}}, "/e.sock", "--vllm-arg --uds: the launcher binds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			argv, _, err := VLLMCommand(tt.opts, tt.sock)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("VLLMCommand = %q, %v; want an error containing %q", argv, err, tt.want)
			}
		})
	}
}

// Not parallel: it empties PATH for the whole process while it runs.
func TestVLLMMissingFromPATHIsAClearError(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	const want = "vllm not found on PATH: install vLLM or pass --vllm-binary"

	_, _, err := VLLMCommand(VLLMOptions{Model: "m"}, "/e.sock")
	if !errors.Is(err, ErrVLLMNotFound) || err.Error() != want {
		t.Fatalf("VLLMCommand error = %v, want %q", err, want)
	}

	l, err := New(Config{
		Model:   "m",
		Command: func(sock string) ([]string, []string, error) { return VLLMCommand(VLLMOptions{Model: "m"}, sock) },
	})
	if err != nil {
		t.Fatal(err)
	}
	err = l.Run(t.Context())
	if !errors.Is(err, ErrVLLMNotFound) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Run = %v, want %q", err, want)
	}
	if state, reason := l.State(); state != "failed" || !strings.Contains(reason, want) {
		t.Errorf("State = %q, %q; want failed with %q", state, reason, want)
	}
	if l.Restarts() != 0 || l.PID() != 0 {
		t.Errorf("Restarts = %d, PID = %d; want nothing started", l.Restarts(), l.PID())
	}
}

func TestRedactHidesSecretFlagValues(t *testing.T) {
	t.Parallel()
	argv := []string{"/usr/bin/vllm", "serve", "m", "--api-key", "sk-1", "--hf-token=hf_2", "--max-num-batched-tokens", "8192",
		"--ssl-keyfile", "/k.pem", "--tokenizer", "t", "--sim-prefill-per-token", "40µs"}
	want := []string{"/usr/bin/vllm", "serve", "m", "--api-key", "REDACTED", "--hf-token=REDACTED", "--max-num-batched-tokens", "8192",
		"--ssl-keyfile", "/k.pem", "--tokenizer", "t", "--sim-prefill-per-token", "40µs"}
	if got := redact(argv); !slices.Equal(got, want) {
		t.Errorf("redact:\n got %q\nwant %q", got, want)
	}
}
