// Command tailgate carries an LLM request from a client to a GPU and back
// inside a tail-latency budget: an OpenAI-compatible gateway with keys,
// quotas and exact metering, a replica router, and a simulated engine, in one
// binary. Run `tailgate help` for the commands; the table of them is in
// cli_dispatch.go.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
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
