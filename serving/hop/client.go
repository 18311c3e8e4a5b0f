package hop

import (
	"fmt"
	"net/http"
)

// Client names the implementation that carries requests to replicas. This
// package's [Transport] is the default because it measured about 8 % less
// CPU per request than net/http's on the gateway's hop (no goroutine
// hand-offs per request); net/http's Transport is the way back, for an
// upstream or a network where the hand-written client misbehaves. Both pass
// the same behaviour table (client_test.go).
type Client string

const (
	// Hop is [Transport] with net/http for what it does not carry.
	Hop Client = "hop"
	// NetHTTP is net/http's Transport alone, set as the Transport is.
	NetHTTP Client = "nethttp"
)

// ParseClient reads an --upstream-client value; "" is [Hop].
func ParseClient(name string) (Client, error) {
	switch c := Client(name); c {
	case "", Hop:
		return Hop, nil
	case NetHTTP:
		return c, nil
	}
	return "", fmt.Errorf("upstream client %q: want hop or nethttp", name)
}

// RoundTripper returns the round tripper client c asks for, configured from
// t (dialer, idle timeout, idle connections per host, buffers; maxIdle idle
// connections in all): t itself with a net/http Fallback, or net/http's
// Transport alone. t must not be used otherwise afterwards. An unknown c is
// [Hop].
func (t *Transport) RoundTripper(c Client, maxIdle int) http.RoundTripper {
	nh := t.NetHTTP(maxIdle)
	if c == NetHTTP {
		return nh
	}
	t.Fallback = nh
	return t
}
