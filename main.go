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
	"os"
	"os/signal"
	"syscall"
)

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
	case "edge":
		return cmdEdge(ctx, rest, stdout, stderr)
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
	case "tune":
		return cmdTune(ctx, rest, stdout, stderr)
	case "backup":
		return cmdBackup(ctx, rest, stdout, stderr)
	case "restore":
		return cmdRestore(ctx, rest, stdout, stderr)
	case "version", "--version", "-version":
		return cmdVersion(ctx, rest, stdout, stderr)
	case "healthcheck":
		return cmdHealthcheck(ctx, rest, stdout, stderr)
	case "init":
		return cmdInit(ctx, rest, stdout, stderr)
	case "help":
		return cmdHelp(ctx, rest, stdout, stderr)
	case "-h", "--help":
		fmt.Fprint(stdout, usageText)
		return nil
	}
	fmt.Fprintf(stderr, "%s\ntailgate: unknown command %q%s\n", usageText, cmd, suggestCommand(cmd))
	return errUsage
}
