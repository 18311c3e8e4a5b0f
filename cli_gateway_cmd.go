package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"slices"

	"github.com/tailgate-dev/tailgate/data"
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
	cfg.BuildInfo = readBuildInfo().collector()
	undo := undoNewDir(cfg.DataDir)
	gw, err := gateway.Open(ctx, cfg, log)
	if err != nil {
		undo()
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
	firstSteps(ctx, stdout, cfg, gw.AdminAddr())
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

// firstSteps says what a gateway started alone lacks, as next steps: a
// replica (workers register with it; /healthz is 503 until one is ready)
// and an API key.
func firstSteps(ctx context.Context, stdout io.Writer, cfg gateway.Config, admin string) {
	dir := cfg.DataDir
	if len(cfg.Upstreams) == 0 && !cfg.Fleet.Enabled() {
		fmt.Fprintf(stdout, "tailgate gateway: no replica yet (/healthz is 503 until one is ready). Workers register at http://%s:\n"+
			"  tailgate workers invite --data %s --replica-id gpu-a   (prints the worker's join token; or approve it once it is listed pending)\n"+
			"  tailgate worker --gateway http://%s --cluster-token-file %s --replica-id gpu-a --model MODEL   (on the GPU box)\n"+
			"  or an OpenAI-compatible server: --upstream URL\n",
			admin, dir, admin, filepath.Join(dir, "cluster.token"))
	}
	st, err := openStore(dir)
	if err != nil {
		return
	}
	defer st.Close()
	if keys, err := st.Keys(ctx, ""); err == nil && !slices.ContainsFunc(keys, func(k data.Key) bool { return !k.Revoked() }) {
		fmt.Fprintf(stdout, "tailgate gateway: no API key yet; make the first: tailgate keys create --data %s --tenant NAME\n", dir)
	}
}
