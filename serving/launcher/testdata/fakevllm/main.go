// Command fakevllm stands in for the `vllm` executable in the launcher's
// tests: it parses `serve MODEL [flags]` as vLLM's argument parser does
// (underscores as dashes, --flag=value or --flag value; an unknown flag or a
// missing value prints the usage and "vllm: error: ..." on stderr and exits
// with status 2) and serves the simulated engine on the Unix socket --uds
// names (then ignoring --host and --port, as vLLM does), else on --host and
// --port. Like vLLM it binds the socket plainly: a path that exists fails,
// the socket gets the umask's mode and is left behind when it exits. Like
// vLLM it requires the key of --api-key or $VLLM_API_KEY on /v1 paths (401
// {"error":"Unauthorized"}), keeps idle connections for
// $VLLM_HTTP_TIMEOUT_KEEP_ALIVE seconds (default 5), and with
// --reasoning-parser gives chat answers a reasoning phase.
//
// It appends one JSON line per event to the file named by $FAKE_VLLM_RECORD:
// "start" (argv, selected environment, its pid and the pid of a `sleep`
// child it leaves in its process group), "chat" and "completion" (each
// request it receives) and "sigterm". Knobs, all environment variables:
//
//	FAKE_VLLM_STARTUP_DELAY=DUR  wait before listening (connection refused meanwhile)
//	FAKE_VLLM_NEVER_READY=1      /health answers 503 forever
//	FAKE_VLLM_EXIT_AFTER=DUR     exit with status 1 DUR after starting
//	FAKE_VLLM_IGNORE_SIGTERM=1   record SIGTERM and keep running
//	FAKE_VLLM_CHAT_STATUS=CODE   answer chat completions with CODE instead
//	FAKE_VLLM_NO_CHAT_TEMPLATE=1 the model has no chat template: chat completions
//	                             get vLLM's 400 for that (a base model)
//	FAKE_VLLM_TTFT=DUR, FAKE_VLLM_TPOT=DUR  the simulated engine's latency
//	FAKE_VLLM_FAIL_STARTS=N      the first N starts recorded in $FAKE_VLLM_RECORD
//	                             fail as vLLM does on a bad model id (a
//	                             traceback on stderr, exit status 1)
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tailgate-dev/tailgate/serving/sim"
)

var recordMu sync.Mutex

// record appends one JSON line to $FAKE_VLLM_RECORD in a single write.
func record(ev map[string]any) {
	path := os.Getenv("FAKE_VLLM_RECORD")
	if path == "" {
		return
	}
	ev["pid"] = os.Getpid()
	ev["time_unix_nano"] = time.Now().UnixNano()
	line, err := json.Marshal(ev)
	if err != nil {
		fatal(err)
	}
	recordMu.Lock()
	defer recordMu.Unlock()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(append(line, '\n')); err != nil {
		fatal(err)
	}
}

// countStarts returns how many starts $FAKE_VLLM_RECORD holds.
func countStarts() int {
	raw, _ := os.ReadFile(os.Getenv("FAKE_VLLM_RECORD"))
	return strings.Count(string(raw), `"event":"start"`)
}

func fatal(v ...any) {
	fmt.Fprintln(os.Stderr, append([]any{"fakevllm:"}, v...)...)
	os.Exit(2)
}

func duration(name string) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		fatal(name, err)
	}
	return d
}

// arity says how many values a vLLM flag takes.
type arity int

const (
	noValue    arity = iota // a boolean flag
	oneValue                // --flag V
	someValues              // --flag V [V...] (nargs="+")
)

// vllmFlags are the `vllm serve` flags the fake knows: the launcher's, and
// those the tests and scripts/gpu-check.sh pass through --vllm-arg.
var vllmFlags = map[string]arity{
	"--host": oneValue, "--port": oneValue, "--uds": oneValue,
	"--served-model-name": someValues, "--api-key": someValues,
	"--tensor-parallel-size": oneValue, "--max-num-seqs": oneValue, "--max-num-batched-tokens": oneValue,
	"--gpu-memory-utilization": oneValue, "--max-model-len": oneValue, "--dtype": oneValue,
	"--reasoning-parser": oneValue, "--tool-call-parser": oneValue, "--chat-template": oneValue,
	"--generation-config": oneValue, "--seed": oneValue, "--stream-interval": oneValue,
	"--enable-prefix-caching": noValue, "--no-enable-prefix-caching": noValue, "--enforce-eager": noValue,
	"--trust-remote-code": noValue, "--enable-auto-tool-choice": noValue, "--enable-log-requests": noValue,
	"--enable-per-request-metrics": noValue, "--disable-log-stats": noValue,
}

// usageError ends the process as argparse does: usage and error on
// stderr, exit status 2.
func usageError(prog, msg string) {
	record(map[string]any{"event": "start", "argv": os.Args, "env": map[string]string{}})
	fmt.Println("INFO 01-02 03:04:05 [__init__.py:239] Automatically detected platform cuda.")
	fmt.Fprintln(os.Stderr, "usage: vllm serve [model_tag] [options]")
	fmt.Fprintf(os.Stderr, "%s: error: %s\n", prog, msg)
	os.Exit(2)
}

// parseServe reads `serve MODEL [flags]` as vLLM's FlexibleArgumentParser
// does, into each flag's values (the last occurrence wins); it exits as
// argparse does on a bad command line.
func parseServe(args []string) (model string, flags map[string][]string) {
	if len(args) < 2 || args[0] != "serve" || strings.HasPrefix(args[1], "-") {
		usageError("vllm serve", "the following arguments are required: model_tag")
	}
	model, flags = args[1], map[string][]string{}
	var unknown []string
	for i := 2; i < len(args); i++ {
		arg := args[i]
		if !strings.HasPrefix(arg, "--") {
			unknown = append(unknown, arg)
			continue
		}
		name, value, inline := strings.Cut(arg, "=")
		name = strings.ReplaceAll(name, "_", "-")
		kind, ok := vllmFlags[name]
		switch {
		case !ok:
			unknown = append(unknown, arg)
			continue
		case kind == noValue:
			if inline {
				usageError("vllm serve", fmt.Sprintf("argument %s: ignored explicit argument '%s'", name, value))
			}
			flags[name] = nil
			continue
		case inline:
			flags[name] = []string{value}
			continue
		}
		var values []string
		for i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") && (kind == someValues || len(values) == 0) {
			i++
			values = append(values, args[i])
		}
		if len(values) == 0 {
			want := "expected one argument"
			if kind == someValues {
				want = "expected at least one argument"
			}
			usageError("vllm serve", fmt.Sprintf("argument %s: %s", name, want))
		}
		flags[name] = values
	}
	if len(unknown) > 0 {
		usageError("vllm", "unrecognized arguments: "+strings.Join(unknown, " "))
	}
	return model, flags
}

func main() {
	model, flags := parseServe(os.Args[1:])
	first := func(name string) string {
		if v := flags[name]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	host, port, uds, served := first("--host"), first("--port"), first("--uds"), first("--served-model-name")
	apiKey := os.Getenv("VLLM_API_KEY") // --api-key wins, as in vLLM
	if k := first("--api-key"); k != "" {
		apiKey = k
	}
	if uds == "" && (host == "" || port == "") {
		fatal("--uds, or --host and --port, are required")
	}
	if served == "" {
		served = model
	}

	if n, _ := strconv.Atoi(os.Getenv("FAKE_VLLM_FAIL_STARTS")); n > 0 && countStarts() < n {
		record(map[string]any{"event": "start", "argv": os.Args, "env": map[string]string{}})
		fmt.Fprintln(os.Stderr, "Traceback (most recent call last):")
		fmt.Fprintln(os.Stderr, `  File "/usr/bin/vllm", line 8, in <module>`)
		fmt.Fprintf(os.Stderr, "OSError: %s is not a local folder and is not a valid model identifier listed on 'https://huggingface.co/models'\n", model)
		os.Exit(1)
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)

	// A child in our process group, holding our stdout open, like vLLM's
	// GPU worker processes: only a signal to the whole group ends it.
	child := exec.Command("sleep", "300")
	child.Stdout = os.Stdout
	if err := child.Start(); err != nil {
		fatal(err)
	}

	env := map[string]string{}
	for _, k := range []string{"VLLM_NO_USAGE_STATS", "CUDA_VISIBLE_DEVICES", "VLLM_API_KEY", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"} {
		if v, ok := os.LookupEnv(k); ok {
			env[k] = v
		}
	}
	record(map[string]any{"event": "start", "argv": os.Args, "env": env, "child_pid": child.Process.Pid})

	go func() {
		for range sigs {
			record(map[string]any{"event": "sigterm"})
			fmt.Println("fakevllm: got SIGTERM")
			if os.Getenv("FAKE_VLLM_IGNORE_SIGTERM") != "1" {
				os.Exit(0)
			}
		}
	}()
	if os.Getenv("FAKE_VLLM_EXIT_AFTER") != "" {
		time.AfterFunc(duration("FAKE_VLLM_EXIT_AFTER"), func() {
			fmt.Fprintln(os.Stderr, "fakevllm: simulated crash")
			os.Exit(1)
		})
	}

	fmt.Printf("fakevllm: loading model %s\n", model)
	fmt.Fprintf(os.Stderr, "fakevllm: progress 1/2\rfakevllm: progress 2/2\n")
	time.Sleep(duration("FAKE_VLLM_STARTUP_DELAY"))

	cfg := sim.Config{Model: served, APIKey: apiKey, TTFT: duration("FAKE_VLLM_TTFT"), TPOT: duration("FAKE_VLLM_TPOT")}
	cfg.MaxSeqs, _ = strconv.Atoi(first("--max-num-seqs"))
	cfg.MaxModelLen, _ = strconv.Atoi(first("--max-model-len"))
	if _, ok := flags["--reasoning-parser"]; ok {
		cfg.ReasoningTokens = 4
	}
	eng, err := sim.New(cfg, nil)
	if err != nil {
		fatal(err)
	}
	api := eng.Handler()
	neverReady := os.Getenv("FAKE_VLLM_NEVER_READY") == "1"
	noTemplate := os.Getenv("FAKE_VLLM_NO_CHAT_TEMPLATE") == "1"
	chatStatus, _ := strconv.Atoi(os.Getenv("FAKE_VLLM_CHAT_STATUS"))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		if neverReady {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		api.ServeHTTP(w, r)
	})
	// Behind the engine's authentication, as in vLLM.
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		if apiKey != "" && r.Header.Get("Authorization") != "Bearer "+apiKey {
			api.ServeHTTP(w, r) // the engine's 401
			return
		}
		record(map[string]any{"event": "chat"})
		switch {
		case noTemplate:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":{"message":"As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat template if the tokenizer does not define one.","type":"BadRequestError","param":null,"code":400}}`)
		case chatStatus != 0:
			http.Error(w, `{"error":{"message":"fake failure"}}`, chatStatus)
		default:
			api.ServeHTTP(w, r)
		}
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		if apiKey == "" || r.Header.Get("Authorization") == "Bearer "+apiKey {
			record(map[string]any{"event": "completion"})
		}
		api.ServeHTTP(w, r)
	})
	mux.Handle("/", api)

	keepAlive := 5 * time.Second // vLLM's default
	if v := os.Getenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			fatal("VLLM_HTTP_TIMEOUT_KEEP_ALIVE:", err)
		}
		keepAlive = time.Duration(n) * time.Second
	}
	var ln net.Listener
	if uds != "" {
		// vllm/entrypoints/openai/api_server.py, create_server_unix_socket:
		// socket.bind(path), nothing more.
		ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: uds, Net: "unix"})
		if err != nil {
			fatal(err)
		}
		ul.SetUnlinkOnClose(false)
		ln = ul
		fmt.Printf("fakevllm: serving %s on unix:%s\n", served, uds)
	} else {
		if ln, err = net.Listen("tcp", net.JoinHostPort(host, port)); err != nil {
			fatal(err)
		}
		fmt.Printf("fakevllm: serving %s on http://%s\n", served, ln.Addr())
	}
	srv := &http.Server{Handler: mux, IdleTimeout: keepAlive}
	fatal(srv.Serve(ln))
}
