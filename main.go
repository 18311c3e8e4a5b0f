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
	"math"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"tailgate/serving/childlog"
)

const usageText = `tailgate — an OpenAI-compatible LLM gateway with a tail-latency budget

Usage:
  tailgate up       [flags]   gateway + N local workers on one machine, simulated engine by default (start here)
  tailgate gateway  [flags]   the gateway alone, in front of --upstream servers and registered workers
  tailgate worker   [flags]   one GPU box: launches vLLM (or the sim), fronts it, registers with a gateway
  tailgate sim      [flags]   the simulated engine alone (vLLM-compatible HTTP)
  tailgate keys create|list|edit|revoke [flags]   manage API keys in a data directory
  tailgate tenants list|show|set [flags]     tenants' budgets and what they spent
  tailgate workers list|revoke [flags]       list or revoke worker credentials
  tailgate usage    [flags]   usage totals per tenant, key and model
  tailgate backup   [flags] FILE   consistent copy of the database while a gateway runs
  tailgate bench    [flags]   matched-workload benchmark: steady, burst, replica kill, scale-out (try --scenario failover)
  tailgate version            version, commit, Go and tailscale versions of this binary (also --version)
  tailgate healthcheck [flags]  exit 0/1: a gateway's or worker's health endpoint (container health checks)

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
	case "tenants":
		return cmdTenants(ctx, rest, stdout, stderr)
	case "workers":
		return cmdWorkers(ctx, rest, stdout, stderr)
	case "usage":
		return cmdUsage(ctx, rest, stdout, stderr)
	case "bench":
		return cmdBench(ctx, rest, stdout, stderr)
	case "backup":
		return cmdBackup(ctx, rest, stdout, stderr)
	case "version", "--version", "-version":
		return cmdVersion(ctx, rest, stdout, stderr)
	case "healthcheck":
		return cmdHealthcheck(ctx, rest, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usageText)
		return nil
	}
	fmt.Fprintf(stderr, "tailgate: unknown command %q\n\n%s", cmd, usageText)
	return errUsage
}

// newFlagSet returns the flag set of `tailgate SYNOPSIS`: -h prints the
// synopsis and every flag on stderr. Parse it with parseFlags or parseArgs.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: tailgate %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args of a command that takes flags only: any other
// argument is an error (with the flag package alone, a stray word would end
// the flags silently and drop every flag after it).
func parseFlags(fs *flag.FlagSet, args []string) error {
	_, err := parseArgs(fs, args, 0)
	return err
}

// parseArgs parses flags that may come before, between and after at most maxArgs
// positional arguments (`backup FILE --force`), and returns the positional
// ones; after "--" every argument is positional. -h prints the usage and
// returns flag.ErrHelp. A bad flag or an argument too many prints a short
// usage, then the error as the last line, and returns errUsage.
func parseArgs(fs *flag.FlagSet, args []string, maxArgs int) ([]string, error) {
	out, usage := fs.Output(), fs.Usage
	// The flag package would print its error first and the whole flag list
	// after it, burying the error; it is reported below instead.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	defer func() { fs.SetOutput(out); fs.Usage = usage }()
	var pos []string
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(out)
			usage()
			return nil, err
		}
		if err != nil {
			return nil, usageError(fs, out, usage, err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
	if err := secretsFromEnv(fs, os.Getenv); err != nil {
		return nil, usageError(fs, out, usage, err)
	}
	if len(pos) > maxArgs {
		err := fmt.Errorf("unexpected argument %q", pos[maxArgs])
		if maxArgs == 0 {
			err = fmt.Errorf("unexpected argument %q: %s takes flags only", pos[maxArgs], fs.Name())
		}
		if v := pos[maxArgs]; v == "true" || v == "false" {
			err = fmt.Errorf("%w (a switch takes its value after '=', e.g. --json=%s)", err, v)
		}
		return nil, usageError(fs, out, usage, err)
	}
	return pos, nil
}

// usageError prints the synopsis of fs's usage (not its flag list), a hint
// to -h, and err as the last line, on w; it returns errUsage.
func usageError(fs *flag.FlagSet, w io.Writer, usage func(), err error) error {
	var b strings.Builder
	prev := fs.Output()
	fs.SetOutput(&b)
	usage()
	fs.SetOutput(prev)
	synopsis, _, _ := strings.Cut(b.String(), "\n\nFlags:\n")
	fmt.Fprintf(w, "%s\nRun 'tailgate %s -h' for its flags.\n\ntailgate %s: %v\n", synopsis, fs.Name(), fs.Name(), err)
	return errUsage
}

// logFlags are the logging flags every long-running command has. Its
// logger flattens the log lines of child processes that a command forwards
// (see childlog).
type logFlags struct {
	level  string
	format string
}

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&l.format, "log-format", "text", "log format: text or json")
}

// parse registers the log flags on fs (after the command's own), parses
// args and returns the logger they ask for: every long-running command's
// prelude.
func (l *logFlags) parse(fs *flag.FlagSet, args []string, stderr io.Writer) (*slog.Logger, error) {
	l.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	return l.logger(stderr)
}

func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	// childlog filters by level: a child's line forwarded at INFO may be an
	// error (see childlog.NewHandler).
	opts := &slog.HandlerOptions{Level: slog.Level(math.MinInt32)}
	var h slog.Handler
	switch strings.ToLower(l.format) {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("--log-format must be text or json, not %q", l.format)
	}
	return slog.New(childlog.NewHandler(h, level)), nil
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }
