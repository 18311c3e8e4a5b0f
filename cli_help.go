package main

import (
	"context"
	"embed"
	"fmt"
	"io"
	"strings"
)

// docPages are the pages of docs/, embedded so that `tailgate help TOPIC`
// prints them on a box with no network and no checkout. docs/_incoming
// (other engineers' drafts) is not a page.
//
//go:embed docs/*.md
var docPages embed.FS

// helpTopics are the docs pages in the order `tailgate help` lists them:
// each is docs/NAME.md. TestHelpTopicsAreTheDocsPages keeps this list and
// the folder the same.
var helpTopics = []struct{ name, about string }{
	{"commands", "every command and its flags: up, gateway, worker, init, version, healthcheck"},
	{"api", "API and metering: endpoints, errors, the Batch API, what is billed and when"},
	{"keys", "budgets and keys: keys, tenants, usage, limits, priority classes"},
	{"deploying", "deploying on several boxes: systemd, containers, Kubernetes, secrets, PostgreSQL"},
	{"mesh", "the mesh: workers over a tailnet with Tailscale or Headscale, no public port"},
	{"routing", "hedging and routing: replica selection, retries, hedges, admission queue"},
	{"benchmarking", "tailgate bench: scenarios, fan-out, priority, a deployment, comparing, the report"},
	{"tuning", "tuning a worker for a latency target: tailgate tune, from a token profile to a deployed config"},
	{"operations", "operations: admin API, metrics, alerts, dashboard, probes, latency budgets, backups"},
	{"capacity", "capacity that follows demand: held requests, the fleet controller, autoscaling"},
	{"edge", "the edge in front of regional gateways: tailgate edge, the Cloudflare Worker"},
	{"sim", "the simulated engine: what it answers, its knobs, where it differs from vLLM"},
	{"design", "the design: the request path, the code layout, reading a request through the code"},
}

// cmdHelp prints the command list and the topics, or one topic's page.
func cmdHelp(_ context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stdout, usageText(commands()))
		fmt.Fprint(stdout, "\nTopics (tailgate help TOPIC prints the page, as in docs/TOPIC.md):\n")
		for _, t := range helpTopics {
			fmt.Fprintf(stdout, "  %-13s %s\n", t.name, t.about)
		}
		return nil
	}
	if len(args) > 1 {
		fmt.Fprintf(stderr, "Usage: tailgate help [TOPIC]\n\ntailgate help: one topic at a time, not %q\n", strings.Join(args, " "))
		return errUsage
	}
	name := strings.TrimSuffix(strings.ToLower(args[0]), ".md")
	page, err := docPages.ReadFile("docs/" + name + ".md")
	if err != nil || strings.HasPrefix(name, "_") {
		names := make([]string, len(helpTopics))
		for i, t := range helpTopics {
			names[i] = t.name
		}
		fmt.Fprintf(stderr, "Usage: tailgate help [TOPIC]\n\ntailgate help: no topic %q (topics: %s; a command's flags: tailgate %s -h)\n", args[0], strings.Join(names, ", "), args[0])
		return errUsage
	}
	_, err = stdout.Write(page)
	return err
}
