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

// commands is the table of cli_dispatch.go, in the order the usage lists
// it: each command's entry point (cmdNAME), or its table of subcommands. It is a function,
// not a variable, because help reads the table it is in.
func commands() []command {
	return []command{
		{name: "up", synopsis: "[flags]", short: "gateway + N local workers on one machine, simulated engine by default (start here)", run: cmdUp},
		{name: "gateway", synopsis: "[flags]", short: "the gateway alone, in front of --upstream servers and registered workers", run: cmdGateway},
		{name: "worker", synopsis: "[flags]", short: "one GPU box: launches vLLM (or the sim), fronts it, registers with a gateway", run: cmdWorker},
		{name: "sim", synopsis: "[flags]", short: "the simulated engine alone (vLLM-compatible HTTP)", run: cmdSim},
		{name: "edge", synopsis: "[flags]", short: "in front of regional gateways: each request to the region with the best expected first token", run: cmdEdge},
		cmdKeys(),
		cmdTenants(),
		cmdWorkers(),
		{name: "usage", synopsis: "[flags]", short: "usage totals per tenant, key and model", run: cmdUsage},
		{name: "backup", synopsis: "[flags] FILE", short: "consistent copy of the database while a gateway runs", run: cmdBackup},
		{name: "restore", synopsis: "[flags] FILE", short: "put a backup in place of the database (gateway stopped)", run: cmdRestore},
		{name: "bench", synopsis: "[flags]", short: "matched-workload benchmark: steady, burst, replica kill, scale-out (try --scenario failover)", run: cmdBench},
		{name: "tune", synopsis: "[flags]", short: "try engine configurations against a latency target; write the cheapest that holds it (--check revalidates)", run: cmdTune},
		{name: "version", aliases: []string{"--version", "-version"}, short: "version, commit, Go and tailscale versions of this binary (also --version)", run: cmdVersion},
		{name: "healthcheck", synopsis: "[flags]", short: "exit 0/1: a gateway's or worker's health endpoint (container health checks)", run: cmdHealthcheck},
		{name: "init", synopsis: "[flags]", short: "prepare a data directory (tokens, database) before a gateway first starts", run: cmdInit},
		{name: "help", synopsis: "[TOPIC]", short: "the documentation offline: the topics, or one page (tailgate help commands)", run: cmdHelp},
	}
}
