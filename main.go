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
	"strings"
	"syscall"
)

const usageText = `tailgate — an OpenAI-compatible LLM gateway with a tail-latency budget

Usage:
  tailgate up       [flags]   gateway + N local workers on one machine, simulated engine by default (start here)
  tailgate gateway  [flags]   the gateway alone, in front of --upstream servers and registered workers
  tailgate worker   [flags]   one GPU box: launches vLLM (or the sim), fronts it, registers with a gateway
  tailgate sim      [flags]   the simulated engine alone (vLLM-compatible HTTP)
  tailgate edge     [flags]   in front of regional gateways: each request to the region with the best expected first token
  tailgate keys create|list|edit|revoke [flags]   manage API keys in a data directory
  tailgate tenants list|show|set [flags]     tenants' budgets and what they spent
  tailgate workers list|revoke [flags]       list or revoke worker credentials
  tailgate usage    [flags]   usage totals per tenant, key and model
  tailgate backup   [flags] FILE   consistent copy of the database while a gateway runs
  tailgate restore  [flags] FILE   put a backup in place of the database (gateway stopped)
  tailgate bench    [flags]   matched-workload benchmark: steady, burst, replica kill, scale-out (try --scenario failover)
  tailgate version            version, commit, Go and tailscale versions of this binary (also --version)
  tailgate healthcheck [flags]  exit 0/1: a gateway's or worker's health endpoint (container health checks)
  tailgate init     [flags]   prepare a data directory (tokens, database) before a gateway first starts
  tailgate help     [TOPIC]   the documentation offline: the topics, or one page (tailgate help commands)

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

// suggestCommand returns " (did you mean X?)" for the command of usageText
// nearest to cmd, or "" when none is near.
func suggestCommand(cmd string) string {
	var names []string
	for _, line := range strings.Split(usageText, "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "tailgate" && !strings.HasPrefix(f[1], "-") && !strings.HasPrefix(f[1], "COMMAND") {
			names = append(names, f[1])
		}
	}
	if best := nearest(strings.TrimLeft(cmd, "-"), names); best != "" {
		return " (did you mean " + best + "?)"
	}
	return ""
}
