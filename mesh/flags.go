package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"tailgate/mesh"
)

// meshFlags join a role to a tailnet.
type meshFlags struct {
	enabled    bool
	controlURL string
	authKey    string
	hostname   string
	ephemeral  bool
	tags       string
}

func (m *meshFlags) register(fs *flag.FlagSet, defaultHost string) {
	fs.BoolVar(&m.enabled, "mesh", false, "join a tailnet (Tailscale or Headscale) with an embedded node and use it for the gateway↔worker hop")
	fs.StringVar(&m.controlURL, "mesh-control-url", "", "control server URL, e.g. https://headscale.example.com (default: Tailscale's)")
	fs.StringVar(&m.authKey, "mesh-authkey", "", "auth key to join the tailnet (default: $TAILGATE_MESH_AUTHKEY, else $TS_AUTHKEY); not needed once DIR/mesh holds a node")
	fs.StringVar(&m.hostname, "mesh-hostname", defaultHost, "this node's tailnet host name")
	fs.BoolVar(&m.ephemeral, "mesh-ephemeral", false, "join as an ephemeral node (removed from the tailnet when it goes offline)")
	fs.StringVar(&m.tags, "mesh-tags", "", "comma-separated ACL tags to request, e.g. tag:tailgate-worker")
}

// up joins the tailnet, with state under dataDir/mesh.
func (m *meshFlags) up(ctx context.Context, dataDir string, log *slog.Logger) (*mesh.Node, error) {
	node, err := mesh.Up(ctx, mesh.Config{
		Hostname: m.hostname, Dir: filepath.Join(dataDir, "mesh"), ControlURL: m.controlURL,
		AuthKey: m.authKey, Ephemeral: m.ephemeral, Tags: splitList(m.tags), Log: log,
	})
	var le *mesh.LoginError
	switch {
	case errors.As(err, &le):
		return nil, fmt.Errorf("%w; this node needs to be authorised: open %s, or pass --mesh-authkey (or set TS_AUTHKEY) with a pre-authorised key", err, le.URL)
	case errors.Is(err, mesh.ErrRefused):
		return nil, fmt.Errorf("%w; check --mesh-authkey (it may be expired, used up or for another tailnet) and --mesh-tags (the control server decides which tags a node may have: "+
			"on Tailscale, tagOwners in the tailnet policy file must name the key's owner, or use a key made with the tags; "+
			"on Headscale, tagOwners in its ACL policy, or a key made with `headscale preauthkeys create --tags`)", err)
	case errors.Is(err, mesh.ErrTimeout):
		return nil, fmt.Errorf("%w; check --mesh-control-url and that this box reaches the control server", err)
	}
	return node, err
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// warnSecretFlags warns about secrets given as command-line flags: any
// user of the box can read them in ps and /proc, and shells keep them in
// their history. Files and environment variables do not leak that way.
func warnSecretFlags(log *slog.Logger, fs *flag.FlagSet, names ...string) {
	fs.Visit(func(f *flag.Flag) {
		for _, n := range names {
			if f.Name == n && f.Value.String() != "" {
				alt := map[string]string{"cluster-token": "--cluster-token-file or TAILGATE_CLUSTER_TOKEN in the environment", "mesh-authkey": "TAILGATE_MESH_AUTHKEY (or TS_AUTHKEY) in the environment"}[n]
				log.Warn("a secret on the command line is visible to every user of this box (ps, /proc); prefer "+alt, "flag", "--"+n)
			}
		}
	})
}
