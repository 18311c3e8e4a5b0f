package launcher

import (
	"errors"
	"fmt"
	"math"
	"os/exec"
	"strconv"
	"strings"
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
	// ExtraArgs are appended verbatim after the flags above (--vllm-arg).
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
		// vLLM's flag would win over the key the launcher gives it in the
		// environment, and the sidecar would be refused.
		if a == "--api-key" || strings.HasPrefix(a, "--api-key=") {
			return errors.New("vllm: --api-key is the launcher's: each engine start gets a random one")
		}
	}
	return nil
}

// ErrVLLMNotFound is returned by [VLLMCommand] when Binary is "" and no vllm
// is on PATH.
var ErrVLLMNotFound = errors.New("vllm not found on PATH: install vLLM or pass --vllm-binary")

// VLLMCommand returns the argv (argv[0] the resolved binary) and the extra
// environment that start vLLM's OpenAI server for o on 127.0.0.1:port:
//
//	vllm serve MODEL --host 127.0.0.1 --port PORT [--served-model-name N]
//	  [--tensor-parallel-size N] [--max-num-seqs N] [--max-num-batched-tokens N]
//	  [--gpu-memory-utilization F] [extra...]
//
// The environment turns vLLM's usage reporting off and, when o.GPUs is set,
// pins the GPUs. The engine binds loopback only: the sidecar is its one client.
func VLLMCommand(o VLLMOptions, port int) (argv []string, env []string, err error) {
	if err := o.Validate(); err != nil {
		return nil, nil, err
	}
	if port <= 0 || port > math.MaxUint16 {
		return nil, nil, fmt.Errorf("vllm: bad port %d", port)
	}
	bin := o.Binary
	if bin == "" {
		if bin, err = exec.LookPath("vllm"); err != nil {
			return nil, nil, ErrVLLMNotFound
		}
	} else if bin, err = exec.LookPath(bin); err != nil {
		return nil, nil, fmt.Errorf("vllm binary: %w", err)
	}

	argv = []string{bin, "serve", o.Model, "--host", "127.0.0.1", "--port", strconv.Itoa(port)}
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
	argv = append(argv, o.ExtraArgs...)

	env = []string{"VLLM_NO_USAGE_STATS=1"}
	if o.GPUs != "" {
		env = append(env, "CUDA_VISIBLE_DEVICES="+o.GPUs)
	}
	return argv, env, nil
}
