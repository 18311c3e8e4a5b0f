package server

import (
	"net/http"
	"net/netip"
	"testing"
)

// TestForwardedForReadsPastTrustedProxiesOnly: the client is the first
// address from the right that is not a trusted proxy's; what a client
// wrote into the header itself is never read, and a peer that is not a
// trusted proxy names nobody.
func TestForwardedForReadsPastTrustedProxiesOnly(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	for _, tc := range []struct {
		peer string
		xff  []string
		want string // "" for none
	}{
		{"10.0.0.5:4000", []string{"203.0.113.7"}, "203.0.113.7"},
		{"10.0.0.5:4000", []string{"198.51.100.1, 203.0.113.7"}, "203.0.113.7"},             // the left one is the client's own claim
		{"10.0.0.5:4000", []string{"203.0.113.7, 10.0.0.9"}, "203.0.113.7"},                 // two proxies
		{"10.0.0.5:4000", []string{"198.51.100.1", "203.0.113.7, 10.1.2.3"}, "203.0.113.7"}, // two header lines
		{"[::1]:4000", []string{"::ffff:203.0.113.7"}, "203.0.113.7"},
		{"192.0.2.1:4000", []string{"203.0.113.7"}, ""},       // not a trusted proxy
		{"10.0.0.5:4000", []string{"203.0.113.7, junk"}, ""},  // nothing left of junk can be believed
		{"10.0.0.5:4000", nil, ""},                            // the proxy's own request (a health poll)
		{"10.0.0.5:4000", []string{"10.0.0.7, 10.0.0.8"}, ""}, // proxies only
	} {
		r := &http.Request{RemoteAddr: tc.peer, Header: http.Header{}}
		for _, v := range tc.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		got, ok := forwardedFor(r, trusted)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("peer %s X-Forwarded-For %q: %q %v, want %q", tc.peer, tc.xff, got, ok, tc.want)
		}
	}
}
