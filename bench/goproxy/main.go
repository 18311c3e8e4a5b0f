// Command goproxy is the bare Go hop bench-overhead.sh measures beside the
// gateway and nginx: net/http's server and client joined by
// httputil.ReverseProxy, and nothing else — no authentication, no
// metering, no routing. What it adds over calling the engine directly is
// what Go's HTTP stack costs a hop on this machine; what the gateway adds
// beyond that is the gateway's own work.
//
// Usage: goproxy --upstream http://HOST:PORT [--listen 127.0.0.1:0]
// It prints "GOPROXY_LISTEN host:port" once it listens.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	upstream := flag.String("upstream", "", "engine base URL, e.g. http://127.0.0.1:8000")
	flag.Parse()
	u, err := url.Parse(*upstream)
	if err != nil || u.Scheme == "" || u.Host == "" {
		fmt.Fprintln(os.Stderr, "goproxy: --upstream must be a URL like http://127.0.0.1:8000")
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "goproxy:", err)
		os.Exit(1)
	}
	p := httputil.NewSingleHostReverseProxy(u)
	// Keep-alive with room for every connection the load generator opens,
	// as the gateway's own transport has.
	p.Transport = &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, DisableCompression: true}
	p.FlushInterval = -1 // streams are relayed as they come, as the gateway does
	fmt.Println("GOPROXY_LISTEN", ln.Addr())
	fmt.Fprintln(os.Stderr, "goproxy:", http.Serve(ln, p))
	os.Exit(1)
}
