package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/tailgate-dev/tailgate/server/gateway"
)

func cmdGateway(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		cfg gateway.Config
		lf  logFlags
	)
	fs := gatewayFlagSet(&cfg, &lf, stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	warnSecretFlags(log, fs, "mesh-authkey")
	if err := cfg.Load(fs); err != nil {
		return err
	}
	if len(cfg.Upstreams) == 0 && !cfg.Fleet.Enabled() {
		log.Warn("no upstream configured: add --upstream URL (or upstreams in --config); /healthz stays 503 until one is ready")
	}
	cfg.BuildInfo = readBuildInfo().collector()
	gw, err := gateway.Open(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer gw.Close()
	if err := gw.UseConfiguredFleet(nil); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "tailgate gateway: API %s  admin %s  (admin token: %s)\n",
		gw.PublicURL(), gw.DashboardLink(isTerminal(stdout)), filepath.Join(cfg.DataDir, "admin.token"))
	if u := gw.MeshURL(); u != "" {
		fmt.Fprintf(stdout, "tailgate gateway: API on the tailnet %s\n", u)
	}
	if u := gw.FunnelURL(); u != "" {
		fmt.Fprintf(stdout, "tailgate gateway: API on the internet through Tailscale Funnel %s\n", u)
	}
	return gw.Run(ctx)
}

// gatewayFlagSet is the flag set of `tailgate gateway`: the gateway's
// config, its mesh flags, then the log flags.
func gatewayFlagSet(cfg *gateway.Config, lf *logFlags, stderr io.Writer) *flag.FlagSet {
	fs := newFlagSet("gateway", "gateway --data DIR --listen ADDR --admin-listen ADDR [--upstream URL]...", stderr)
	cfg.RegisterFlags(fs)
	cfg.RegisterMeshFlags(fs)
	lf.register(fs)
	return fs
}
