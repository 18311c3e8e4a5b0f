package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/tailgate-dev/tailgate/serving/launcher"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

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
		sf       sim.Flags
		lf       logFlags
	)
	sf.Register(fs)
	log, err := lf.parse(fs, args, stderr)
	if err != nil {
		return err
	}
	if err := sf.Check(); err != nil {
		return err
	}
	cfg := sf.Config(*model)
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
	simLoad(ctx, log, sf.StartDelay())
	if ctx.Err() != nil {
		return nil // stopped while loading
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
		"structured_outputs", "filler values that satisfy the request's JSON schema, regex or choice",
		"model", *model, "ttft", cfg.TTFT, "tpot", cfg.TPOT, "stall_prob", cfg.StallProb, "max_seqs", cfg.MaxSeqs,
		"reasoning_tokens", cfg.ReasoningTokens, "error_rate", cfg.ErrorRate, "429_rate", cfg.RateLimitRate, "hang_rate", cfg.HangRate, "api_key_required", cfg.APIKey != "",
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

// simLoad waits --sim-start-delay before the engine listens, as vLLM loads:
// its API server binds the port before the engine is built but listens
// only once the model is loaded (vllm/entrypoints/openai/api_server.py:
// setup_server binds, build_and_serve → serve_http listens after
// build_async_engine_client), so until then a connection is refused and
// nothing answers /health. The sim opens its listener only after the
// delay: a TCP client is refused the same way; on a Unix socket the path
// is missing instead of refusing, which a launcher reads as "not yet" too.
func simLoad(ctx context.Context, log *slog.Logger, delay time.Duration) {
	if delay == 0 {
		return
	}
	log.Info("simulated engine loading: it listens once --sim-start-delay has passed", "start_delay", delay)
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
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
