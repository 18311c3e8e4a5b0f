// Command fakevllm stands in for the `vllm` executable in the launcher's
// tests: it accepts `serve MODEL --host H --port P [--served-model-name N]
// [anything else, ignored]` and serves the simulated engine there.
//
// It appends one JSON line per event to the file named by $FAKE_VLLM_RECORD:
// "start" (argv, selected environment, its pid and the pid of a `sleep`
// child it leaves in its process group), "chat" (each chat completion it
// receives) and "sigterm". Knobs, all environment variables:
//
//	FAKE_VLLM_STARTUP_DELAY=DUR  wait before listening (connection refused meanwhile)
//	FAKE_VLLM_NEVER_READY=1      /health answers 503 forever
//	FAKE_VLLM_EXIT_AFTER=DUR     exit with status 1 DUR after starting
//	FAKE_VLLM_IGNORE_SIGTERM=1   record SIGTERM and keep running
//	FAKE_VLLM_CHAT_STATUS=CODE   answer chat completions with CODE instead
//	FAKE_VLLM_REJECT_ARG=ARG     refuse ARG as vLLM's argument parser does
//	                             (usage and error on stderr, exit status 2)
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"tailgate/serving/sim"
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

func main() {
	args := os.Args[1:]
	if len(args) < 2 || args[0] != "serve" {
		fatal("usage: vllm serve MODEL --host H --port P [--served-model-name N] ...")
	}
	model, host, port, served := args[1], "", "", ""
	apiKey := os.Getenv("VLLM_API_KEY") // --api-key wins, as in vLLM
	for i := 2; i < len(args)-1; i++ {
		switch args[i] {
		case "--api-key":
			apiKey = args[i+1]
		case "--host":
			host = args[i+1]
		case "--port":
			port = args[i+1]
		case "--served-model-name":
			served = args[i+1]
		}
	}
	if host == "" || port == "" {
		fatal("--host and --port are required")
	}
	if served == "" {
		served = model
	}

	if bad := os.Getenv("FAKE_VLLM_REJECT_ARG"); bad != "" && slices.Contains(args, bad) {
		record(map[string]any{"event": "start", "argv": os.Args, "env": map[string]string{}})
		fmt.Println("INFO 01-02 03:04:05 [__init__.py:239] Automatically detected platform cuda.")
		fmt.Fprintln(os.Stderr, "usage: vllm serve [model_tag] [options]")
		fmt.Fprintln(os.Stderr, "vllm: error: unrecognized arguments: "+bad)
		os.Exit(2)
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
	for _, k := range []string{"VLLM_NO_USAGE_STATS", "CUDA_VISIBLE_DEVICES", "VLLM_API_KEY"} {
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

	eng, err := sim.New(sim.Config{Model: served, APIKey: apiKey}, nil)
	if err != nil {
		fatal(err)
	}
	api := eng.Handler()
	neverReady := os.Getenv("FAKE_VLLM_NEVER_READY") == "1"
	chatStatus, _ := strconv.Atoi(os.Getenv("FAKE_VLLM_CHAT_STATUS"))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		if neverReady {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		api.ServeHTTP(w, r)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		record(map[string]any{"event": "chat"})
		if chatStatus != 0 {
			http.Error(w, `{"error":{"message":"fake failure"}}`, chatStatus)
			return
		}
		api.ServeHTTP(w, r)
	})
	mux.Handle("/", api)

	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		fatal(err)
	}
	fmt.Printf("fakevllm: serving %s on http://%s\n", served, ln.Addr())
	fatal(http.Serve(ln, mux))
}
