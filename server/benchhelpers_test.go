package server_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// benchStack is the gateway wired as `tailgate gateway` wires it (default
// ledger batching, default policy polling) in front of one sim engine, with
// both reachable over loopback HTTP so a benchmark can call either.
type benchStack struct {
	*servertest.Gateway
	direct *httptest.Server // the sim engine
	secret string
}

func newBenchStack(tb testing.TB, cfg sim.Config) *benchStack {
	tb.Helper()
	// Hedging is on, as `tailgate gateway` runs unless --hedge=false.
	h := servertest.Start(tb, servertest.Options{Replicas: 1, Sim: cfg, Production: true,
		Router: router.Config{Hedge: router.HedgeConfig{Enabled: true}},
		Prices: map[string]policy.Price{cfg.Model: {InputMicrosPerM: 200_000, OutputMicrosPerM: 600_000}}})
	return &benchStack{Gateway: h, direct: h.Upstreams[0], secret: benchKey(h)}
}

// benchKey is a key with every limit on (and far away), so admission does
// all its work.
func benchKey(h *servertest.Gateway) string {
	huge := int64(1 << 60)
	return h.Key(policy.KeyOptions{
		Tenant: "bench", RPM: 1 << 40, TPM: 1 << 40, MaxConcurrency: 1 << 20,
		BudgetTokens: &huge, BudgetMicros: &huge,
	})
}

// meteredRequests flushes the ledger and returns how many requests it holds.
func (s *benchStack) meteredRequests(tb testing.TB) int64 {
	tb.Helper()
	for deadline := time.Now().Add(10 * time.Second); s.Inflight() > 0 && time.Now().Before(deadline); {
		time.Sleep(2 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Ledger.Flush(ctx); err != nil {
		tb.Fatal(err)
	}
	rows, err := s.Store.Usage(ctx, data.UsageFilter{})
	if err != nil {
		tb.Fatal(err)
	}
	var n int64
	for _, r := range rows {
		n += r.Requests
	}
	return n
}

// benchClient is a keep-alive client with room for every parallel caller.
func benchClient(tb testing.TB) *http.Client {
	c := &http.Client{Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, DisableCompression: true}}
	tb.Cleanup(c.CloseIdleConnections)
	return c
}

// postAndCheck sends body to url and reads the whole answer; for a stream it
// checks that the answer ends with [DONE].
func postAndCheck(c *http.Client, url, secret, body string, stream bool, buf *bytes.Buffer) error {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	buf.Reset()
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return &statusError{resp.StatusCode, buf.String()}
	}
	if stream && !bytes.HasSuffix(bytes.TrimRight(buf.Bytes(), "\n"), []byte("data: [DONE]")) {
		return &statusError{resp.StatusCode, "stream did not end with [DONE]"}
	}
	return nil
}

type statusError struct {
	status int
	body   string
}

func (e *statusError) Error() string {
	return http.StatusText(e.status) + ": " + strings.TrimSpace(e.body)
}

// countContentEvents counts the SSE events of a stream that carry content.
func countContentEvents(r io.Reader) int {
	n := 0
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if bytes.HasPrefix(sc.Bytes(), []byte("data: ")) && bytes.Contains(sc.Bytes(), []byte(`"content":"`)) &&
			!bytes.Contains(sc.Bytes(), []byte(`"content":""`)) {
			n++
		}
	}
	return n
}
