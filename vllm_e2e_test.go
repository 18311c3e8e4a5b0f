package main

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
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "vllm"), "./serving/launcher/testdata/fakevllm")
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

	// Each worker started vllm serve with its GPU, on loopback, with the extra argument.
	f, err := os.Open(record)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gpus, keys := map[string]bool{}, map[string]bool{}
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
		if !strings.HasPrefix(args, "serve org/fake-model --host 127.0.0.1 --port ") || !strings.HasSuffix(args, " --enable-prefix-caching") {
			t.Errorf("vllm argv: %q", args)
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
