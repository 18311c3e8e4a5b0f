package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/tailgate-dev/tailgate/serving/edge"
)

func cmdEdge(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		cfg edge.Config
		lf  logFlags
	)
	fs := newFlagSet("edge", "edge --listen ADDR --edge-token-file FILE --region NAME=URL [--region NAME=URL]... [--prefer NAME]", stderr)
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:8090", "where clients connect (plain HTTP; put TLS in front, or use the Cloudflare Worker in deploy/cloudflare)")
	fs.StringVar(&cfg.AdminListen, "admin-listen", "127.0.0.1:8091", "/metrics and /edge/v1/regions, unauthenticated: keep it on loopback or a private network (\"\": off)")
	fs.Func("region", "a regional gateway as NAME=URL, its public listener, e.g. eu=https://eu.example.com (repeatable; the order breaks exact ties)", func(v string) error {
		name, u, ok := strings.Cut(v, "=")
		if !ok || name == "" || u == "" {
			return errors.New("want NAME=URL, e.g. eu=https://eu.example.com")
		}
		cfg.Regions = append(cfg.Regions, edge.Region{Name: name, URL: u})
		return nil
	})
	fs.StringVar(&cfg.Prefer, "prefer", "", "region that wins near ties (geography as the tie-breaker), e.g. the one nearest this edge")
	fs.DurationVar(&cfg.PollInterval, "poll-interval", time.Second, "how often each region's status is read")
	fs.DurationVar(&cfg.PollTimeout, "poll-timeout", 800*time.Millisecond, "bound of one status poll; a region that does not answer in time is skipped")
	fs.Float64Var(&cfg.SwitchMargin, "switch-margin", 0.2, "how much better (fraction of expected first-token time) another region must be to take a model's traffic")
	fs.IntVar(&cfg.SwitchPolls, "switch-polls", 3, "for how many polls in a row another region must be that much better")
	fs.Float64Var(&cfg.QueueWeight, "queue-weight", 1, "queue penalty: median TTFTs added per request queued ahead on each replica")
	fs.BoolVar(&cfg.H2C, "h2c", false, "speak HTTP/2 without TLS to http:// regions (tailgate gateways accept it): one connection per region, kept warm by the polls, so moving traffic opens none")
	fs.Int64Var(&cfg.MaxPeek, "max-peek", 1<<20, "bytes of a body held to read its model and to send it to the next region when a connection fails")
	fs.Int64Var(&cfg.MaxPeekInFlight, "max-peek-in-flight", 256<<20, "body bytes held at once over all requests; past it a request waits up to 2s, then gets 503 body_budget_exhausted")
	fs.IntVar(&cfg.MaxConnections, "max-connections", 4096, "client connections open at once; at the cap idle keep-alive ones are closed first, then new ones wait")
	fs.IntVar(&cfg.MaxConnsPerIP, "max-connections-per-address", 0, "client connections one address may hold open (0: 1/8 of --max-connections)")
	fs.DurationVar(&cfg.IdleTimeout, "idle-timeout", 120*time.Second, "a kept-alive client connection idle this long is closed")
	fs.DurationVar(&cfg.BodyTimeout, "body-timeout", 30*time.Second, "time a client has to send a request body, plus one second per --body-min-rate bytes; a slower one gets 408")
	fs.Int64Var(&cfg.BodyMinRate, "body-min-rate", 64<<10, "slowest a request body may arrive after its first --body-timeout, in bytes per second")
	tokenFile := fs.String("edge-token-file", "", "file holding the regions' edge token (a gateway's DIR/edge.token), sent on the status polls: a region serves its status to edges only")
	lf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	if *tokenFile == "" {
		return errors.New("--edge-token-file is required: a region serves its status (GET /edge/v1/status) to edges holding its edge token; copy a gateway's DIR/edge.token here (every region's gateway reads the same token: --edge-token-file on tailgate gateway)")
	}
	raw, err := os.ReadFile(*tokenFile)
	if err != nil {
		return fmt.Errorf("--edge-token-file: %w", err)
	}
	if cfg.StatusToken = strings.TrimSpace(string(raw)); cfg.StatusToken == "" {
		return fmt.Errorf("--edge-token-file %s is empty; copy a gateway's DIR/edge.token", *tokenFile)
	}
	e, err := edge.Open(cfg, log)
	if err != nil {
		return err
	}
	defer e.Close()
	names := make([]string, len(cfg.Regions))
	for i, r := range cfg.Regions {
		names[i] = r.Name
	}
	fmt.Fprintf(stdout, "tailgate edge: %s → regions %s  admin %s\n", e.URL(), strings.Join(names, ", "), e.AdminURL())
	return e.Run(ctx)
}
