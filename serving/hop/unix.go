package hop

import (
	"context"
	"errors"
	"net"
	"time"
)

// errNoSocket is the dial error while there is no socket to dial yet.
var errNoSocket = errors.New("no engine socket yet")

// DialUnix returns a Dial for [Transport] (or net/http's DialContext) that
// connects to the Unix socket path() names at the time of each dial,
// whatever host and port the request's URL names: for a server that listens
// on a socket instead of a port, such as an engine a worker started with
// vLLM's --uds. The URL's host then only keys the pool of idle connections.
// While path() is "" every dial fails, as a *net.OpError like a refused one.
// timeout bounds each dial; 0 means none beyond the request's context.
func DialUnix(path func() string, timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	return func(ctx context.Context, _, _ string) (net.Conn, error) {
		p := path()
		if p == "" {
			return nil, &net.OpError{Op: "dial", Net: "unix", Err: errNoSocket}
		}
		return d.DialContext(ctx, "unix", p)
	}
}
