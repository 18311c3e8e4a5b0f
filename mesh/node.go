package mesh

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"tailscale.com/client/local"
	"tailscale.com/envknob"
	"tailscale.com/tsnet"
)

// Node is a running tailnet node. Its methods are safe for concurrent use.
type Node struct {
	srv      *tsnet.Server
	lc       *local.Client
	hostname string // as the tailnet knows us (short MagicDNS name)

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// Up brings a node up and waits until it is running on the tailnet: signed
// in, with a tailnet address and its home relay connected. It fails with
// [ErrNeedsLogin], [ErrRefused] or [ErrTimeout] when it cannot get there, or
// with ctx's error. The caller closes the node.
func Up(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("mesh: %w", err)
	}
	cfg = cfg.withDefaults()
	if cfg.ControlURL == "" {
		cfg.ControlURL = os.Getenv("TS_CONTROL_URL") // as tsnet would; named in messages
	}
	if !cfg.UploadLogs {
		envknob.SetNoLogsNoSupport()
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("mesh: state directory: %w", err)
	}
	srv := &tsnet.Server{
		Dir:           cfg.Dir,
		Hostname:      cfg.Hostname,
		ControlURL:    cfg.ControlURL,
		AuthKey:       cfg.AuthKey,
		AdvertiseTags: cfg.Tags,
		Ephemeral:     cfg.Ephemeral,
		Logf:          debugLogf(cfg.Log, "tsnet"),
		UserLogf:      debugLogf(cfg.Log, "tsnet"),
	}
	cfg.Log.Info("mesh: joining tailnet", "hostname", cfg.Hostname, "control", controlURL(cfg.ControlURL),
		"state", cfg.Dir, "ephemeral", cfg.Ephemeral, "auth_key", authKey(cfg) != "")
	lc, err := srv.LocalClient() // starts the node
	if err != nil {
		// A failed start has released what it opened; Close would panic.
		return nil, fmt.Errorf("mesh: start node: %w", err)
	}
	j := joiner{srv: srv, lc: lc, cfg: cfg}
	st, err := j.run(ctx)
	if err != nil {
		srv.Close()
		return nil, err
	}
	n := &Node{srv: srv, lc: lc, hostname: firstLabel(st.Self.DNSName, cfg.Hostname)}
	ip4, _ := srv.TailscaleIPs()
	cfg.Log.Info("mesh: up", "hostname", n.hostname, "addr", ip4, "dns_name", strings.TrimSuffix(st.Self.DNSName, "."))
	return n, nil
}

// Listen listens on the tailnet only, e.g. Listen("tcp", ":9000"): no socket
// is opened on the host, so the port is reachable only from tailnet peers.
// The host part of addr must be empty or one of the node's tailnet addresses.
func (n *Node) Listen(network, addr string) (net.Listener, error) {
	if n.closed.Load() {
		return nil, fmt.Errorf("mesh: listen %s: %w", addr, net.ErrClosed)
	}
	if host, _, err := net.SplitHostPort(addr); err == nil && host != "" {
		ip, err := netip.ParseAddr(host)
		if err != nil || !ip.IsUnspecified() && !n.isSelf(ip) {
			return nil, fmt.Errorf("mesh: listen %s: host must be empty or a tailnet address of this node", addr)
		}
	}
	ln, err := n.srv.Listen(network, addr)
	if err != nil {
		return nil, fmt.Errorf("mesh: listen %s: %w", addr, err)
	}
	return ln, nil
}

// Dial connects to addr through the tailnet. The host may be a tailnet host
// name ("tg-worker-1:9000"), a MagicDNS name or a tailnet IP; any other
// address is dialed from the host as usual. Errors are *net.OpError with Op
// "dial", as from a net.Dialer, so callers classify them the same way. A
// peer that has left the tailnet does not refuse: the dial runs into ctx's
// deadline.
func (n *Node) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if n.closed.Load() {
		return nil, &net.OpError{Op: "dial", Net: network, Addr: dialAddr{network, addr}, Err: net.ErrClosed}
	}
	c, err := n.srv.Dial(ctx, network, addr)
	if err != nil {
		return nil, dialError(network, addr, err)
	}
	return c, nil
}

// dialError makes err a *net.OpError with Op "dial". tsnet reports refusals
// as Op "connect" and timeouts as bare context errors.
func dialError(network, addr string, err error) error {
	if op, ok := errors.AsType[*net.OpError](err); ok {
		if op.Op == "dial" {
			return err
		}
		e := *op
		e.Op = "dial"
		return &e
	}
	return &net.OpError{Op: "dial", Net: network, Addr: dialAddr{network, addr}, Err: err}
}

// dialAddr is an address as given to Dial, possibly a host name.
type dialAddr struct{ network, addr string }

func (a dialAddr) Network() string { return a.network }
func (a dialAddr) String() string  { return a.addr }

// Addr returns the node's tailnet IPv4 address.
func (n *Node) Addr() (netip.Addr, bool) {
	ip4, _ := n.srv.TailscaleIPs()
	return ip4, ip4.IsValid()
}

// Hostname returns the node's name on the tailnet, the one peers dial. It is
// [Config.Hostname] unless the control server had to pick another.
func (n *Node) Hostname() string { return n.hostname }

func (n *Node) isSelf(ip netip.Addr) bool {
	ip4, ip6 := n.srv.TailscaleIPs()
	return ip == ip4 || ip == ip6
}

// Close takes the node off the tailnet and closes its listeners and
// connections. It is safe to call more than once.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.closed.Store(true)
		if err := n.srv.Close(); err != nil {
			n.closeErr = fmt.Errorf("mesh: close: %w", err)
		}
	})
	return n.closeErr
}

// Peer is a tailnet node as the control server describes it.
type Peer struct {
	Hostname string     // its short MagicDNS name, the one it is dialed by
	Tags     []string   // ACL tags, e.g. "tag:tailgate-worker"; nil if none
	Addr     netip.Addr // its tailnet IPv4 address (IPv6 if it has none)
	User     string     // owner's login name; tagged nodes belong to the tags, not a user
}

// WhoIs names the peer behind remoteAddr ("ip:port" or "ip"), such as the
// RemoteAddr of an http.Request accepted on a [Node.Listen] listener. It
// fails with [ErrUnknownPeer] for an address no tailnet node holds.
func (n *Node) WhoIs(ctx context.Context, remoteAddr string) (Peer, error) {
	res, err := n.lc.WhoIs(ctx, remoteAddr)
	switch {
	case errors.Is(err, local.ErrPeerNotFound):
		return Peer{}, fmt.Errorf("%w: %s", ErrUnknownPeer, remoteAddr)
	case err != nil:
		return Peer{}, fmt.Errorf("mesh: whois %s: %w", remoteAddr, err)
	case res.Node == nil:
		return Peer{}, fmt.Errorf("%w: %s", ErrUnknownPeer, remoteAddr)
	}
	var requested string
	if hi := res.Node.Hostinfo; hi.Valid() {
		requested = hi.Hostname()
	}
	p := Peer{Hostname: firstLabel(res.Node.Name, requested), Tags: res.Node.Tags}
	for _, pfx := range res.Node.Addresses {
		if a := pfx.Addr(); !p.Addr.IsValid() || a.Is4() && !p.Addr.Is4() {
			p.Addr = a
		}
	}
	if res.UserProfile != nil && !res.Node.IsTagged() {
		p.User = res.UserProfile.LoginName
	}
	return p, nil
}

// firstLabel returns the first label of a DNS name ("w1" of "w1.tail.ts.net."),
// or fallback when name is empty.
func firstLabel(name, fallback string) string {
	if label, _, _ := strings.Cut(name, "."); label != "" {
		return label
	}
	return fallback
}

// debugLogf adapts tsnet's printf-style logs to log at Debug.
func debugLogf(log *slog.Logger, source string) func(format string, args ...any) {
	return func(format string, args ...any) {
		if !log.Enabled(context.Background(), slog.LevelDebug) {
			return
		}
		log.Debug(strings.TrimSuffix(fmt.Sprintf(format, args...), "\n"), "source", source)
	}
}

func authKey(cfg Config) string {
	if cfg.AuthKey != "" {
		return cfg.AuthKey
	}
	if k := os.Getenv("TS_AUTHKEY"); k != "" {
		return k
	}
	return os.Getenv("TS_AUTH_KEY") // tsnet reads it too
}
