// Command tailgate carries an LLM request from a client to a GPU and back
// inside a tail-latency budget: an OpenAI-compatible gateway with keys,
// quotas and exact metering, a replica router, and a simulated engine, in one
// binary. Run `tailgate help` for the commands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

const usageText = `tailgate — an OpenAI-compatible LLM gateway with a tail-latency budget

Usage:
  tailgate up       [flags]   gateway + N local workers on one machine, simulated engine by default (start here)
  tailgate gateway  [flags]   the gateway alone, in front of --upstream servers and registered workers
  tailgate worker   [flags]   one GPU box: launches vLLM (or the sim), fronts it, registers with a gateway
  tailgate sim      [flags]   the simulated engine alone (vLLM-compatible HTTP)
  tailgate keys create|list|revoke [flags]   manage API keys in a data directory
  tailgate usage    [flags]   usage totals per tenant, key and model
  tailgate bench    [flags]   matched-workload benchmark: steady, burst, replica kill, scale-out (try --scenario failover)

Run 'tailgate COMMAND -h' for the flags of a command.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "tailgate: %v\n", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return errUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "up":
		return cmdUp(ctx, rest, stdout, stderr)
	case "gateway":
		return cmdGateway(ctx, rest, stdout, stderr)
	case "sim":
		return cmdSim(ctx, rest, stdout, stderr)
	case "worker":
		return cmdWorker(ctx, rest, stdout, stderr)
	case "keys":
		return cmdKeys(ctx, rest, stdout, stderr)
	case "usage":
		return cmdUsage(ctx, rest, stdout, stderr)
	case "bench":
		return cmdBench(ctx, rest, stdout, stderr)
	case "backup":
		return cmdBackup(ctx, rest, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usageText)
		return nil
	}
	fmt.Fprintf(stderr, "tailgate: unknown command %q\n\n%s", cmd, usageText)
	return errUsage
}

// newFlagSet returns a flag set that prints its usage on stderr and reports
// errors instead of exiting.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: tailgate %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args and maps a flag error to errUsage (the flag
// package has printed it already).
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	return nil
}

// logFlags are the logging flags every long-running command has.
type logFlags struct {
	level  string
	format string
}

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&l.format, "log-format", "text", "log format: text or json")
}

func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(l.format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format must be text or json, not %q", l.format)
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }
