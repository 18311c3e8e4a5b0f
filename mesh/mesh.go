// Package mesh runs tailgate's userspace Tailscale node (tsnet): it brings a
// node up, listens, dials and tells who a peer is. It is the only package that
// imports tailscale.com, and it imports nothing of the project.
package mesh
