package mesh

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
)

// Flags join a role (gateway or worker) to a tailnet: the --mesh and
// --mesh-* flags both roles share. The zero value is no mesh.
type Flags struct {
	Enabled    bool   // --mesh
	ControlURL string // --mesh-control-url; "": Tailscale's
	AuthKey    string // --mesh-authkey
	Hostname   string // --mesh-hostname
	Ephemeral  bool   // --mesh-ephemeral
	Tags       string // --mesh-tags, comma-separated
}

// Register defines the mesh flags on fs; defaultHost is --mesh-hostname's
// default.
func (m *Flags) Register(fs *flag.FlagSet, defaultHost string) {
	fs.BoolVar(&m.Enabled, "mesh", false, "join a tailnet (Tailscale or Headscale) with an embedded node and use it for the gateway↔worker hop")
	fs.StringVar(&m.ControlURL, "mesh-control-url", "", "control server URL, e.g. https://headscale.example.com (default: Tailscale's)")
	fs.StringVar(&m.AuthKey, "mesh-authkey", "", "auth key to join the tailnet (default: $TAILGATE_MESH_AUTHKEY, else $TS_AUTHKEY); not needed once DIR/mesh holds a node")
	fs.StringVar(&m.Hostname, "mesh-hostname", defaultHost, "this node's tailnet host name")
	fs.BoolVar(&m.Ephemeral, "mesh-ephemeral", false, "join as an ephemeral node (removed from the tailnet when it goes offline)")
	fs.StringVar(&m.Tags, "mesh-tags", "", "comma-separated ACL tags to request, e.g. tag:tailgate-worker")
}

// Up joins the tailnet, with state under dataDir/mesh. Its errors say which
// flag to look at.
func (m *Flags) Up(ctx context.Context, dataDir string, log *slog.Logger) (*Node, error) {
	node, err := Up(ctx, Config{
		Hostname: m.Hostname, Dir: filepath.Join(dataDir, "mesh"), ControlURL: m.ControlURL,
		AuthKey: m.AuthKey, Ephemeral: m.Ephemeral, Tags: SplitList(m.Tags), Log: log,
	})
	var le *LoginError
	switch {
	case errors.As(err, &le):
		return nil, fmt.Errorf("%w; this node needs to be authorised: open %s, or pass --mesh-authkey (or set TS_AUTHKEY) with a pre-authorised key", err, le.URL)
	case errors.Is(err, ErrRefused):
		return nil, fmt.Errorf("%w; check --mesh-authkey (it may be expired, used up or for another tailnet) and --mesh-tags (the control server decides which tags a node may have: "+
			"on Tailscale, tagOwners in the tailnet policy file must name the key's owner, or use a key made with the tags; "+
			"on Headscale, tagOwners in its ACL policy, or a key made with `headscale preauthkeys create --tags`)", err)
	case errors.Is(err, ErrTimeout):
		return nil, fmt.Errorf("%w; check --mesh-control-url and that this box reaches the control server", err)
	}
	return node, err
}

// SplitList reads a comma-separated flag (tags, host names); blanks are
// dropped.
func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
