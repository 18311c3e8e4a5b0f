package mesh

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"tailscale.com/tstest"
	"tailscale.com/tstest/integration/testcontrol"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestCertsNeedTailnetHTTPS: a tailnet that sends no certificate name
// (HTTPS off, or Headscale) makes Certs fail with ErrNoHTTPS saying what to
// enable; one that does names the node's MagicDNS name.
func TestCertsNeedTailnetHTTPS(t *testing.T) {
	tstest.ResourceCheck(t)
	ctx := t.Context()
	off := startControl(t, func(c *testcontrol.Server) { c.MagicDNSDomain = "" })
	n := startNode(t, ctx, off.HTTPTestServer.URL, "gw", nil)
	_, err := n.Certs(nil)
	if !errors.Is(err, ErrNoHTTPS) || !strings.Contains(err.Error(), "admin console") || !strings.Contains(err.Error(), "Headscale") {
		t.Fatalf("Certs on a tailnet without HTTPS = %v; want ErrNoHTTPS saying what to enable", err)
	}

	on := startControl(t, nil)
	n = startNode(t, ctx, on.HTTPTestServer.URL, "gw", nil)
	c, err := n.Certs(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Domain() != "gw.tail-scale.ts.net" {
		t.Fatalf("certificate name %q, want gw.tail-scale.ts.net", c.Domain())
	}
	if _, err := c.GetCertificate(nil); err == nil || !strings.Contains(err.Error(), "being obtained") {
		t.Fatalf("before Run, GetCertificate = %v; want an error saying it is being obtained", err)
	}
}

// TestCertsRetryAndSayWhy: when the certificate cannot be obtained (here
// the ACME CA does not answer), Run logs why at WARN with the attempt and
// the wait before the next, retries, keeps refusing handshakes with a
// clear error, and returns when its context ends.
func TestCertsRetryAndSayWhy(t *testing.T) {
	tstest.ResourceCheck(t)
	dead := "https://127.0.0.1:" + freeHostPort(t) + "/dir"
	t.Setenv("TS_DEBUG_ACME_DIRECTORY_URL", dead)
	control := startControl(t, nil)
	n := startNode(t, t.Context(), control.HTTPTestServer.URL, "gw", nil)
	logs := &testkit.Buffer{}
	c, err := n.Certs(slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(logs.String(), "attempt=2") {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("no second attempt logged in 60s:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil when its context ends", err)
	}
	first := strings.Split(logs.String(), "\n")[0]
	for _, w := range []string{"level=WARN", "no HTTPS certificate from the tailnet yet", "domain=gw.tail-scale.ts.net", "attempt=1", "retry_in=1s", "127.0.0.1"} {
		if !strings.Contains(first, w) {
			t.Errorf("failure log lacks %q: %s", w, first)
		}
	}
	if _, err := c.GetCertificate(nil); err == nil || !strings.Contains(err.Error(), "gw.tail-scale.ts.net") {
		t.Errorf("GetCertificate without a certificate = %v; want an error naming the domain", err)
	}
}
