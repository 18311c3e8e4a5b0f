package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestUpWithVLLMEngine runs `tailgate up --engine vllm` against the fake
// `vllm` executable (the simulated engine behind vLLM's command line): the
// workers launch it with the expected arguments, wait for it, warm it up,
// register, and serve requests for the model.
func TestUpWithVLLMEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "vllm"), "../serving/launcher/testdata/fakevllm")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build fake vllm: %v\n%s", err, out)
	}
	record := filepath.Join(t.TempDir(), "vllm.jsonl")
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("FAKE_VLLM_RECORD", record)

	p := startUp(t, "--replicas", "2", "--engine", "vllm", "--model", "org/fake-model",
		"--vllm-arg=--enable-prefix-caching", "--warmup", "2")
	g := &gatewayProcess{t: t, admin: p.admin, api: p.api, key: p.demoKey, token: readToken(t, filepath.Join(p.dir, "admin.token"))}
	g.waitReady("worker-1", "worker-2")

	body := `{"model":"org/fake-model","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, _, raw, err := g.chatBody(ctx, body)
	if err != nil || code != 200 || !strings.Contains(raw, `"completion_tokens":3`) {
		t.Fatalf("request through vLLM workers: %d %v %s", code, err, raw)
	}

	// Each worker started vllm serve with its GPU, on a Unix socket of its own
	// (no TCP port), with the extra argument.
	f, err := os.Open(record)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gpus, keys, socks := map[string]bool{}, map[string]bool{}, map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ev struct {
			Event string            `json:"event"`
			Argv  []string          `json:"argv"`
			Env   map[string]string `json:"env"`
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Event != "start" {
			continue
		}
		args := strings.Join(ev.Argv[1:], " ")
		if len(ev.Argv) != 6 || ev.Argv[3] != "--uds" || socks[ev.Argv[4]] ||
			strings.Join([]string{ev.Argv[1], ev.Argv[2], ev.Argv[5]}, " ") != "serve org/fake-model --enable-prefix-caching" {
			t.Errorf("vllm argv: %q, want serve org/fake-model --uds <a socket of its own> --enable-prefix-caching", args)
		} else {
			socks[ev.Argv[4]] = true
		}
		// Each engine got its own API key, in its environment, not its argv.
		key := ev.Env["VLLM_API_KEY"]
		if key == "" || keys[key] || strings.Contains(args, key) {
			t.Errorf("vllm API key %q: want a fresh one per engine, only in its environment (argv %q)", key, args)
		}
		keys[key] = true
		if ev.Env["VLLM_NO_USAGE_STATS"] != "1" {
			t.Errorf("VLLM_NO_USAGE_STATS = %q", ev.Env["VLLM_NO_USAGE_STATS"])
		}
		gpus[ev.Env["CUDA_VISIBLE_DEVICES"]] = true
	}
	if !gpus["0"] || !gpus["1"] {
		t.Fatalf("CUDA_VISIBLE_DEVICES per worker: %v, want 0 and 1", gpus)
	}
}
