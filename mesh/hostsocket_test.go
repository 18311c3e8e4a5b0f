package mesh

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"tailscale.com/tstest"
)

// TestListenOpensNoHostSocket pins that a worker's sidecar in mesh mode is
// reachable over the tailnet and nowhere else: no host socket listens on its
// port, on any address. The node does add one host TCP listener of its own,
// tailscale's peer API (a port it picks above 32767), which hangs up on
// anything that does not come from the tailnet; the test pins that too.
func TestListenOpensNoHostSocket(t *testing.T) {
	tstest.ResourceCheck(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	url := startControl(t, nil).HTTPTestServer.URL
	gateway := startNode(t, ctx, url, "gateway", nil)

	before := listeningSockets(t)
	worker := startNode(t, ctx, url, "worker", nil)
	port := freeHostPort(t)
	if _, err := worker.Listen("tcp", "127.0.0.1:"+port); err == nil {
		t.Fatal("Listen on a host address succeeded; want an error")
	}
	ln, err := worker.Listen("tcp", ":"+port)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "sidecar") }))

	res := get(t, ctx, client(t, gateway), "http://worker:"+port+"/")
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || string(body) != "sidecar" {
		t.Fatalf("over the tailnet: status %d, body %q; want 200 sidecar", res.StatusCode, body)
	}

	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		for _, s := range readProcNet(t, f) {
			if s.listening && strings.HasSuffix(s.local, ":"+port) {
				t.Errorf("%s: a host socket listens on %s", f, s.local)
			}
		}
	}
	for _, addr := range hostAddrs(t) {
		hostPort := net.JoinHostPort(addr, port)
		if c, err := net.DialTimeout("tcp", hostPort, time.Second); err == nil {
			c.Close()
			t.Errorf("dial %s outside the tailnet connected; want refused", hostPort)
		}
	}

	peerAPI := peerAPIPort(t, ctx, worker)
	for inode, addr := range listeningSockets(t) {
		if _, ok := before[inode]; ok {
			continue
		}
		if !strings.HasSuffix(addr, ":"+peerAPI) {
			t.Errorf("the node opened a host TCP listener on %s (peer API port is %s)", addr, peerAPI)
		}
	}
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+peerAPI, time.Second)
	if err != nil {
		return // not listening on loopback at all
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n > 0 || err != io.EOF {
		t.Errorf("peer API kept a host connection: read %d bytes, %v; want EOF at once", n, err)
	}
}

// peerAPIPort returns the port of n's peer API.
func peerAPIPort(t *testing.T, ctx context.Context, n *Node) string {
	t.Helper()
	st, err := n.lc.StatusWithoutPeers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Self.PeerAPIURL) == 0 {
		t.Fatal("node has no peer API URL")
	}
	_, port, err := net.SplitHostPort(strings.TrimPrefix(st.Self.PeerAPIURL[0], "http://"))
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// hostAddrs returns every address of the host's interfaces.
func hostAddrs(t *testing.T) []string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLinkLocalUnicast() {
			out = append(out, ipn.IP.String())
		}
	}
	return out
}

type procSocket struct {
	local     string // hex address:port as the kernel prints it, port in decimal
	listening bool
	inode     string
}

// readProcNet parses /proc/net/tcp or tcp6.
func readProcNet(t *testing.T, path string) []procSocket {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) && path == "/proc/net/tcp6" {
		return nil // no IPv6 on this host
	}
	if err != nil {
		t.Skipf("no %s: %v", path, err)
	}
	var out []procSocket
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		addr, hexPort, _ := strings.Cut(f[1], ":")
		port, err := strconv.ParseUint(hexPort, 16, 16)
		if err != nil {
			t.Fatalf("%s: bad local address %q", path, f[1])
		}
		out = append(out, procSocket{local: addr + ":" + strconv.FormatUint(port, 10), listening: f[3] == "0A", inode: f[9]})
	}
	return out
}

// listeningSockets returns this process's TCP listening sockets by inode.
func listeningSockets(t *testing.T) map[string]string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	ours := map[string]bool{}
	for _, fd := range fds {
		target, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if inode, ok := strings.CutPrefix(target, "socket:["); err == nil && ok {
			ours[strings.TrimSuffix(inode, "]")] = true
		}
	}
	out := map[string]string{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		for _, s := range readProcNet(t, f) {
			if s.listening && ours[s.inode] {
				out[s.inode] = s.local
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("found none of this process's listening sockets (the control server's at least); cannot tell")
	}
	return out
}
