package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"tailgate/serving/launcher"
	"tailgate/serving/sim"
)

// simFlags are the simulated engine's knobs, shared by `sim` and `up`.
type simFlags struct {
	ttft        time.Duration
	ttftSigma   float64
	tpot        time.Duration
	stallProb   float64
	stallFactor float64
	maxSeqs     int
	seed        int64
	seededLat   bool
	maxTokens   int

	reasoningTokens int
	reasoningField  string
	embeddingDim    int
	errorRate       float64
	rateLimitRate   float64
	retryAfter      time.Duration
	hangRate        float64
	keepAlive       time.Duration
	streamInterval  int
	kvCacheTokens   int
}

func (f *simFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&f.ttft, "sim-ttft", 150*time.Millisecond, "simulated engine: median time to first token")
	fs.Float64Var(&f.ttftSigma, "sim-ttft-sigma", 0.25, "simulated engine: lognormal spread of the time to first token (negative: none)")
	fs.DurationVar(&f.tpot, "sim-tpot", 15*time.Millisecond, "simulated engine: time per output token")
	fs.Float64Var(&f.stallProb, "sim-stall-prob", 0, "simulated engine: probability that a request stalls")
	fs.Float64Var(&f.stallFactor, "sim-stall-factor", 10, "simulated engine: latency multiplier of a stalled request")
	fs.IntVar(&f.maxSeqs, "sim-max-seqs", 256, "simulated engine: concurrent sequences; more requests queue (FIFO)")
	fs.Int64Var(&f.seed, "sim-seed", 1, "simulated engine: seed of the latency draws")
	fs.BoolVar(&f.seededLat, "sim-seeded-latency", false, "simulated engine: fix each chat/completions request's latency (jitter and stall) by its content (prompt text and seed field) and --sim-seed instead of arrival order, so A/B runs see the same latencies request for request on each replica while replicas draw independently")
	fs.IntVar(&f.maxTokens, "sim-default-max-tokens", 256, "simulated engine: completion cap when a request sets none")
	fs.IntVar(&f.reasoningTokens, "sim-reasoning-tokens", 0, "simulated engine: reasoning tokens before every chat, Responses and Messages answer (0: no reasoning phase); they last N×TPOT and count as completion tokens")
	fs.StringVar(&f.reasoningField, "sim-reasoning-field", sim.ReasoningFieldReasoning, "simulated engine: name of the reasoning text in chat deltas: reasoning (vLLM ≥ 0.12), reasoning_content (≤ 0.10) or both (0.11 to 0.1x)")
	fs.IntVar(&f.embeddingDim, "sim-embedding-dim", 64, "simulated engine: length of /v1/embeddings vectors")
	fs.Float64Var(&f.errorRate, "sim-error-rate", 0, "simulated engine: share of requests answered 500 (seeded)")
	fs.Float64Var(&f.rateLimitRate, "sim-429-rate", 0, "simulated engine: share of requests answered 429 with Retry-After (seeded)")
	fs.DurationVar(&f.retryAfter, "sim-retry-after", time.Second, "simulated engine: the wait a 429 asks for (Retry-After, whole seconds rounded up)")
	fs.Float64Var(&f.hangRate, "sim-hang-rate", 0, "simulated engine: share of requests that hang before their first token until the client goes away (seeded)")
	fs.IntVar(&f.kvCacheTokens, "sim-kv-cache-tokens", 0, "simulated engine: KV cache size in tokens (at least the max model len; 0: none): a request waits, with slots free, until its prompt and output fit, as on a vLLM short of KV blocks")
	fs.IntVar(&f.streamInterval, "sim-stream-interval", 1, "simulated engine: tokens merged into one chat or completions stream chunk, as vLLM's --stream-interval (a request's stream_interval may raise it)")
	fs.DurationVar(&f.keepAlive, "sim-keep-alive", 0, "simulated engine: idle keep-alive connections are closed after this long, as vLLM's uvicorn does (0: $"+sim.KeepAliveEnv+" seconds, else 5s)")
}

func (f *simFlags) config(model string) sim.Config {
	return sim.Config{
		Model: model, TTFT: f.ttft, TTFTSigma: f.ttftSigma, TPOT: f.tpot, StallProb: f.stallProb,
		StallFactor: f.stallFactor, MaxSeqs: f.maxSeqs, Seed: f.seed, LatencyFromContent: f.seededLat, DefaultMaxTokens: f.maxTokens,
		ReasoningTokens: f.reasoningTokens, ReasoningField: f.reasoningField, EmbeddingDim: f.embeddingDim,
		ErrorRate: f.errorRate, RateLimitRate: f.rateLimitRate, RetryAfter: f.retryAfter, HangRate: f.hangRate,
		KeepAlive: f.keepAlive, StreamInterval: f.streamInterval, KVCacheTokens: f.kvCacheTokens,
	}
}

// args renders the knobs back as flags, for child processes.
func (f *simFlags) args() []string {
	return []string{
		"--sim-ttft", f.ttft.String(), "--sim-ttft-sigma", fmt.Sprint(f.ttftSigma), "--sim-tpot", f.tpot.String(),
		"--sim-stall-prob", fmt.Sprint(f.stallProb), "--sim-stall-factor", fmt.Sprint(f.stallFactor),
		"--sim-max-seqs", fmt.Sprint(f.maxSeqs), "--sim-default-max-tokens", fmt.Sprint(f.maxTokens),
		"--sim-reasoning-tokens", fmt.Sprint(f.reasoningTokens), "--sim-reasoning-field", f.reasoningField,
		"--sim-embedding-dim", fmt.Sprint(f.embeddingDim), "--sim-error-rate", fmt.Sprint(f.errorRate),
		"--sim-429-rate", fmt.Sprint(f.rateLimitRate), "--sim-retry-after", f.retryAfter.String(),
		"--sim-hang-rate", fmt.Sprint(f.hangRate), "--sim-keep-alive", f.keepAlive.String(),
		"--sim-stream-interval", fmt.Sprint(f.streamInterval), "--sim-kv-cache-tokens", fmt.Sprint(f.kvCacheTokens),
		"--sim-seeded-latency=" + fmt.Sprint(f.seededLat),
	}
}

// announcePrefix starts the line a child `sim --announce` prints on stdout
// once it listens, so its parent learns the address.
const announcePrefix = "TAILGATE_LISTEN "

func cmdSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("sim", "sim [--listen ADDR | --uds PATH] [--model NAME] [--sim-* knobs]", stderr)
	var (
		listen   = fs.String("listen", "127.0.0.1:8000", "address to serve the vLLM-compatible API on (port 0: any free port)")
		uds      = fs.String("uds", "", "serve on a new Unix socket at PATH (mode 0600) instead of a TCP port, as vLLM's --uds; the worker starts its simulated engine so")
		model    = fs.String("model", "tailgate-sim", "model name to serve")
		announce = fs.Bool("announce", false, "print '"+announcePrefix+"ADDR' on stdout once listening (for programs that start it on port 0)")
		apiKey   = fs.String("api-key", "", "bearer token required on /v1 paths, as vLLM's --api-key (default $"+launcher.EngineKeyEnv+"; empty: none)")
		sf       simFlags
		lf       logFlags
	)
	sf.register(fs)
	log, err := lf.parse(fs, args, stderr)
	if err != nil {
		return err
	}
	cfg := sf.config(*model)
	// As in vLLM, the flag wins over the environment; a worker passes the
	// environment, which ps does not show.
	if cfg.APIKey = *apiKey; cfg.APIKey == "" {
		cfg.APIKey = os.Getenv(launcher.EngineKeyEnv)
	}
	if cfg.KeepAlive == 0 {
		if cfg.KeepAlive, err = sim.ParseKeepAlive(os.Getenv(sim.KeepAliveEnv)); err != nil {
			return err
		}
	}
	eng, err := sim.New(cfg, nil)
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	ln, addr, err := simListener(fs, *listen, *uds)
	if err != nil {
		return err
	}
	srv := eng.NewServer(nil)
	if *announce {
		fmt.Fprintf(stdout, "%s%s\n", announcePrefix, ln.Addr())
	}
	log.Info("simulated engine serving (output is filler text, not a model)", "addr", addr,
		"model", *model, "ttft", sf.ttft, "tpot", sf.tpot, "stall_prob", sf.stallProb, "max_seqs", sf.maxSeqs,
		"reasoning_tokens", sf.reasoningTokens, "error_rate", sf.errorRate, "429_rate", sf.rateLimitRate, "hang_rate", sf.hangRate, "api_key_required", cfg.APIKey != "",
		"keep_alive", srv.IdleTimeout)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("sim: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("sim: shutdown: %w", err)
	}
	return nil
}

// simListener opens what `sim` serves on: the Unix socket --uds names, or
// the TCP address of --listen; addr says which, for the log.
func simListener(fs *flag.FlagSet, listen, uds string) (ln net.Listener, addr string, err error) {
	if uds == "" {
		if ln, err = net.Listen("tcp", listen); err != nil {
			return nil, "", fmt.Errorf("sim: listen: %w", err)
		}
		return ln, "http://" + ln.Addr().String(), nil
	}
	listenGiven := false
	fs.Visit(func(f *flag.Flag) { listenGiven = listenGiven || f.Name == "listen" })
	if listenGiven {
		return nil, "", errors.New("sim: give --listen or --uds, not both")
	}
	if ln, err = sim.ListenUnix(uds); err != nil {
		return nil, "", fmt.Errorf("sim: --uds: %w", err)
	}
	return ln, "unix:" + uds, nil
}
