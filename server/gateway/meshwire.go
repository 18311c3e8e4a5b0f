package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/tailgate-dev/tailgate/mesh"
)

// viaMesh marks requests that arrived on the tailnet listener.
type viaMesh struct{}

// peerCheck returns the gateway's registration check in mesh mode: with an
// allow list, a worker must register over the tailnet from a peer whose
// host name or one of whose tags is listed.
func peerCheck(node *mesh.Node, allow []string) func(*http.Request) error {
	if len(allow) == 0 {
		return nil
	}
	return func(r *http.Request) error {
		if r.Context().Value(viaMesh{}) == nil {
			return errors.New("registration must come over the tailnet (--mesh-allow-peers is set)")
		}
		peer, err := node.WhoIs(r.Context(), r.RemoteAddr)
		if err != nil {
			return fmt.Errorf("unknown tailnet peer: %w", err)
		}
		for _, a := range allow {
			if a == peer.Hostname || slices.Contains(peer.Tags, a) {
				return nil
			}
		}
		return fmt.Errorf("tailnet peer %s (tags %v) is not in --mesh-allow-peers", peer.Hostname, peer.Tags)
	}
}

// peerIdentity names the tailnet node a heartbeat came over (its MagicDNS
// name), so a worker's credential works only from the node that
// registered it; "" for a heartbeat from the host's network.
func peerIdentity(node *mesh.Node) func(*http.Request) string {
	return func(r *http.Request) string {
		if r.Context().Value(viaMesh{}) == nil {
			return ""
		}
		peer, err := node.WhoIs(r.Context(), r.RemoteAddr)
		if err != nil {
			return ""
		}
		return peer.Hostname
	}
}
