package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/tailgate-dev/tailgate/serving/edge"
)

func cmdEdge(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		cfg edge.Config
		lf  logFlags
	)
	fs := newFlagSet("edge", "edge --listen ADDR --region NAME=URL [--region NAME=URL]... [--prefer NAME]", stderr)
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
	lf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
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
