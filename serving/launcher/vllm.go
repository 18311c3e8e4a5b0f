package launcher

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/tailgate-dev/tailgate/serving"
)

// VLLMOptions are the worker's engine flags; [VLLMCommand] turns them into a
// `vllm serve` command line. A zero numeric field leaves vLLM's own default.
type VLLMOptions struct {
	// Binary is the vllm executable; "" means "vllm" looked up on PATH.
	Binary string
	// Model is what vLLM loads: a Hugging Face id or a local path. Required.
	Model string
	// ServedModelName is the name clients use; "" means vLLM serves Model
	// under its own name.
	ServedModelName string
	// GPUs becomes CUDA_VISIBLE_DEVICES (e.g. "0,1"); "" leaves the
	// inherited value alone.
	GPUs                 string
	TensorParallelSize   int
	MaxNumSeqs           int
	MaxNumBatchedTokens  int
	GPUMemoryUtilization float64 // in (0, 1]
	// OTLPTracesEndpoint, when set, is the collector's OTLP/HTTP traces URL
	// (path included, e.g. http://collector:4318/v1/traces) that vLLM sends
	// its own spans to, continuing the sidecar's traceparent: vllm serve
	// --otlp-traces-endpoint, over http/protobuf (vLLM's default is gRPC).
	// vLLM needs its OpenTelemetry packages installed for it.
	OTLPTracesEndpoint string
	// SleepMode lets the gateway put the engine to sleep and wake it:
	// `--enable-sleep-mode` (vLLM's CuMem allocator, which can offload and
	// free the weights) and VLLM_SERVER_DEV_MODE=1, which serves POST
	// /sleep, POST /wake_up and GET /is_sleeping (vLLM v0.11 to v0.1x:
	// vllm/entrypoints/serve/sleep/api_router.py, attach_router; before,
	// vllm/entrypoints/openai/api_server.py). Dev mode also serves vLLM's
	// other development endpoints; the engine listens on the worker's
	// private Unix socket only, so only the sidecar reaches them.
	SleepMode bool
	// PriorityScheduling starts the engine with `--scheduling-policy
	// priority`: its waiting queue is ordered by each request's priority
	// field, a lower value first, then by arrival
	// (vllm/v1/core/sched/request_queue.py, PriorityRequestQueue). The
	// worker tells the gateway, which then sends each request's priority
	// from its key's class.
	PriorityScheduling bool
	// ExtraArgs are appended verbatim after the flags above (--vllm-arg).
	// Validate refuses the flags the launcher sets itself (--host, --port,
	// --uds, --served-model-name, --api-key), in any spelling vLLM accepts.
	ExtraArgs []string
}

// Validate reports whether o can make a command line, without looking for
// the binary.
func (o VLLMOptions) Validate() error {
	switch {
	case o.Model == "":
		return errors.New("vllm: a model is required (--model)")
	case o.TensorParallelSize < 0:
		return fmt.Errorf("vllm: --tensor-parallel-size must not be negative, not %d", o.TensorParallelSize)
	case o.MaxNumSeqs < 0:
		return fmt.Errorf("vllm: --max-num-seqs must not be negative, not %d", o.MaxNumSeqs)
	case o.MaxNumBatchedTokens < 0:
		return fmt.Errorf("vllm: --max-num-batched-tokens must not be negative, not %d", o.MaxNumBatchedTokens)
	case o.GPUMemoryUtilization != 0 && !(o.GPUMemoryUtilization > 0 && o.GPUMemoryUtilization <= 1):
		return fmt.Errorf("vllm: --gpu-memory-utilization must be in (0, 1], not %v", o.GPUMemoryUtilization)
	}
	for _, a := range o.ExtraArgs {
		if why, ok := launcherFlags[flagName(a)]; ok {
			return fmt.Errorf("vllm: --vllm-arg %s: %s", flagName(a), why)
		}
	}
	return nil
}

// launcherFlags are the vLLM flags the launcher sets itself, with what to do
// instead. Passed again in ExtraArgs, vLLM would take the last value and
// the launcher would wait for the wrong name or probe the wrong address
// (or the gateway would not know the engine's scheduling policy).
var launcherFlags = map[string]string{
	"--served-model-name": "use tailgate worker's --served-model-name instead (readiness waits for that name; tailgate up serves --model as named)",
	"--host":              listensOnSocket,
	"--port":              listensOnSocket,
	"--uds":               listensOnSocket,
	// The flag would win over the key the launcher gives the engine in its
	// environment, and the launcher and sidecar would be refused.
	"--api-key": "the API key is the launcher's: each engine start gets a random one that only the sidecar sends; clients use tailgate API keys at the gateway",
	// The gateway must know the policy: it sends a priority only to an
	// engine that takes one (vLLM's default, fcfs, refuses it with 400).
	"--scheduling-policy": "use tailgate worker's --engine-priority-scheduling instead (the worker tells the gateway, which then sends each request's priority from its key's class)",
}

// listensOnSocket is why --host, --port and --uds are the launcher's.
const listensOnSocket = "the launcher binds the engine to a Unix socket only the worker can open; the gateway reaches the worker at --listen / --advertise"

// flagName returns the flag an argument names as vLLM reads it: the part
// before "=" (or a blank), with underscores as dashes ("--served_model_name=x"
// is "--served-model-name"); "" for an argument that is not a long flag.
func flagName(arg string) string {
	if !strings.HasPrefix(arg, "--") {
		return ""
	}
	name, _, _ := strings.Cut(arg, "=")
	if i := strings.IndexAny(name, " \t"); i >= 0 {
		name = name[:i]
	}
	return strings.ReplaceAll(name, "_", "-")
}

// ErrVLLMNotFound is returned by [VLLMCommand] when Binary is "" and no vllm
// is on PATH.
var ErrVLLMNotFound = errors.New("vllm not found on PATH: install vLLM or pass --vllm-binary")

// VLLMCommand returns the argv (argv[0] the resolved binary) and the extra
// environment that start vLLM's OpenAI server for o on the Unix socket at
// socket:
//
//	vllm serve MODEL --uds SOCKET [--served-model-name N]
//	  [--tensor-parallel-size N] [--max-num-seqs N] [--max-num-batched-tokens N]
//	  [--gpu-memory-utilization F] [--otlp-traces-endpoint URL]
//	  [--enable-sleep-mode] [--scheduling-policy priority] [extra...]
//
// vLLM's --uds (vllm/entrypoints/openai/cli_args.py, FrontendArgs.uds: "If
// set, host and port arguments are ignored") makes its API server bind that
// path instead of a TCP port (api_server.py, setup_server and
// create_server_unix_socket: a plain bind, so a path that exists fails and
// the socket gets the umask's mode). No TCP port means no one on the box
// reaches the engine's paths its API key does not guard (/invocations,
// /tokenize, /rerank, /score, /pooling, …): the launcher makes the socket
// in a directory only the worker can open.
//
// The environment turns vLLM's usage reporting off, sets how long it keeps
// an idle connection ([serving.EngineKeepAlive]), when o.GPUs is set,
// pins the GPUs, and with a traces endpoint, makes vLLM export over
// OTLP/HTTP as service "vllm" (unless OTEL_SERVICE_NAME says otherwise).
func VLLMCommand(o VLLMOptions, socket string) (argv []string, env []string, err error) {
	if err := o.Validate(); err != nil {
		return nil, nil, err
	}
	if socket == "" {
		return nil, nil, errors.New("vllm: no socket path")
	}
	bin := o.Binary
	if bin == "" {
		if bin, err = exec.LookPath("vllm"); err != nil {
			return nil, nil, ErrVLLMNotFound
		}
	} else if bin, err = exec.LookPath(bin); err != nil {
		return nil, nil, fmt.Errorf("vllm binary: %w", err)
	}

	argv = []string{bin, "serve", o.Model, "--uds", socket}
	if o.ServedModelName != "" {
		argv = append(argv, "--served-model-name", o.ServedModelName)
	}
	if o.TensorParallelSize > 0 {
		argv = append(argv, "--tensor-parallel-size", strconv.Itoa(o.TensorParallelSize))
	}
	if o.MaxNumSeqs > 0 {
		argv = append(argv, "--max-num-seqs", strconv.Itoa(o.MaxNumSeqs))
	}
	if o.MaxNumBatchedTokens > 0 {
		argv = append(argv, "--max-num-batched-tokens", strconv.Itoa(o.MaxNumBatchedTokens))
	}
	if o.GPUMemoryUtilization > 0 {
		argv = append(argv, "--gpu-memory-utilization", strconv.FormatFloat(o.GPUMemoryUtilization, 'g', -1, 64))
	}
	if o.OTLPTracesEndpoint != "" {
		argv = append(argv, "--otlp-traces-endpoint", o.OTLPTracesEndpoint)
	}
	if o.SleepMode {
		argv = append(argv, "--enable-sleep-mode")
	}
	if o.PriorityScheduling {
		argv = append(argv, "--scheduling-policy", "priority")
	}
	argv = append(argv, o.ExtraArgs...)

	// The keep-alive is set, not inherited: the sidecar's idle timeout is
	// chosen below it.
	env = []string{"VLLM_NO_USAGE_STATS=1",
		"VLLM_HTTP_TIMEOUT_KEEP_ALIVE=" + strconv.Itoa(int(serving.EngineKeepAlive/time.Second))}
	if o.GPUs != "" {
		env = append(env, "CUDA_VISIBLE_DEVICES="+o.GPUs)
	}
	if o.SleepMode {
		env = append(env, "VLLM_SERVER_DEV_MODE=1")
	}
	if o.OTLPTracesEndpoint != "" {
		env = append(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf")
		if os.Getenv("OTEL_SERVICE_NAME") == "" {
			env = append(env, "OTEL_SERVICE_NAME=vllm")
		}
	}
	return argv, env, nil
}
