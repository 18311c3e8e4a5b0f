// Package mesh runs tailgate's userspace Tailscale node (tsnet): it brings a
// node up, listens, dials and tells who a peer is. It is the only package that
// imports tailscale.com, and it imports nothing of the project.
//
// # Overview
//
// [Up] joins a tailnet (Tailscale's, or a Headscale or other control server
// named by [Config.ControlURL]) and returns once the node is running, or fails
// with an error that says why it could not be: [ErrNeedsLogin] (a
// [*LoginError] carrying the URL to visit), [ErrRefused] (the control server
// said no, e.g. to a bad auth key) or [ErrTimeout] (control server unreachable
// or stuck, with its URL and the node's last health problems in the message).
//
// The node's network stack lives in the process: [Node.Listen] accepts only
// connections that arrive over the tailnet and opens no socket on the host,
// and [Node.Dial] reaches peers by tailnet host name. [Node.WhoIs] names the
// peer behind a connection accepted on the tailnet.
//
// [Node.Certs] keeps the node's HTTPS certificate for its MagicDNS name,
// issued through the control server when the tailnet offers certificates
// ([ErrNoHTTPS] when it does not), and [Certs.ListenTLS] serves TLS with it
// on the tailnet. [Certs.ListenFunnel] serves TLS with it on the internet
// through Tailscale Funnel, whose relays reach the node over its own
// outbound connection ([ErrNoFunnel] when the tailnet does not allow it).
//
// The node does open sockets of its own on the host: a UDP socket for
// WireGuard and NAT traversal, which carries only encrypted tailnet traffic,
// and a TCP listener on all addresses for tailscale's peer API (a port above
// 32767 that tailscale picks), which hangs up on any connection that does
// not come from a tailnet address.
package mesh

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Config describes the node to bring up.
type Config struct {
	// Hostname is the node's name on the tailnet. Required. The control server
	// may hand out a different name if it is taken (see [Node.Hostname]).
	Hostname string

	// Dir holds the node's state (keys, tailnet identity), e.g. DIR/mesh.
	// Required; created with mode 0700. A node keeps its identity across
	// restarts through it, so an auth key is needed only the first time.
	Dir string

	// ControlURL is the coordination server, e.g. a Headscale URL.
	// Empty means $TS_CONTROL_URL, and if that is empty too, Tailscale's.
	ControlURL string

	// AuthKey registers a new node without an interactive login.
	// Empty means $TS_AUTHKEY. It is not used once Dir holds a registered node.
	AuthKey string

	// Tags are the ACL tags the node asks for (e.g. "tag:tailgate-worker").
	// The control server decides whether it gets them. Nil asks for none.
	Tags []string

	// Ephemeral registers the node as ephemeral: the control server removes
	// it soon after it goes offline.
	Ephemeral bool

	// Log receives progress at Info (joining, waiting, up) and tsnet's own
	// verbose logs at Debug. Nil discards everything.
	Log *slog.Logger

	// UpTimeout bounds how long [Up] waits for the node to be running.
	// Zero means 60s.
	UpTimeout time.Duration

	// UploadLogs lets the node upload its logs to Tailscale's log service
	// (needed for Tailscale's support). The default, false, keeps every log
	// on the box and sets TS_NO_LOGS_NO_SUPPORT for the whole process: a
	// self-hosted gateway should talk to nothing but its control server and
	// peers.
	UploadLogs bool
}

const defaultUpTimeout = 60 * time.Second

// Validate reports whether c can bring a node up.
func (c Config) Validate() error {
	switch {
	case c.Hostname == "":
		return errors.New("hostname is required")
	case c.Dir == "":
		return errors.New("state directory is required")
	case c.UpTimeout < 0:
		return fmt.Errorf("up timeout %v is negative", c.UpTimeout)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.UpTimeout == 0 {
		c.UpTimeout = defaultUpTimeout
	}
	return c
}

var (
	// ErrNeedsLogin means the control server wants an interactive login
	// before it admits the node. The error is a [*LoginError] with the URL.
	ErrNeedsLogin = errors.New("mesh: node needs login")

	// ErrRefused means the control server refused the node, e.g. because
	// its auth key is invalid, expired or already used, or because it
	// expired the node's key (as it does to a node asking for tags it may
	// not have).
	ErrRefused = errors.New("mesh: control server refused the node")

	// ErrTimeout means the node was not running within [Config.UpTimeout]:
	// the control server could not be reached, or the node is waiting for
	// an administrator to approve it.
	ErrTimeout = errors.New("mesh: timed out joining the tailnet")

	// ErrUnknownPeer means an address belongs to no node of the tailnet.
	ErrUnknownPeer = errors.New("mesh: not a tailnet peer")
)

// LoginError is returned by [Up] when the node must be logged in
// interactively. It matches [ErrNeedsLogin] with errors.Is.
type LoginError struct {
	URL string // where a user logs the node in
}

func (e *LoginError) Error() string {
	return fmt.Sprintf("mesh: node needs login: visit %s to add it to the tailnet, or start it with an auth key (TS_AUTHKEY)", e.URL)
}

// Is makes errors.Is(err, ErrNeedsLogin) true.
func (e *LoginError) Is(target error) bool { return target == ErrNeedsLogin }
