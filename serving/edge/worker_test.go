package edge_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/serving"
)

// startWorker runs deploy/cloudflare/worker.js in workerd (the real
// Workers runtime, npm package workerd) on a loopback port, with the
// regions as its REGIONS var, and returns its URL. Without workerd on
// PATH (or $TAILGATE_WORKERD) the test is skipped and says so;
// scripts/test.sh installs it.
func startWorker(t *testing.T, regions, prefer string) string {
	t.Helper()
	bin := os.Getenv("TAILGATE_WORKERD")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("workerd"); err != nil {
			t.Skip("workerd not installed (npm install -g workerd, as scripts/test.sh does): the Worker's tests did not run")
		}
	}
	src, err := os.ReadFile(filepath.Join("..", "..", "deploy", "cloudflare", "worker.js"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "worker.js"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	conf := fmt.Sprintf(`using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [
    (name = "main", worker = .edge),
    (name = "loopback", network = (allow = ["public", "private", "local"])),
  ],
  sockets = [(name = "http", address = %q, http = (), service = "main")],
);
const edge :Workerd.Worker = (
  modules = [(name = "worker.js", esModule = embed "worker.js")],
  compatibilityDate = "2025-09-01",
  globalOutbound = "loopback",
  bindings = [
    (name = "REGIONS", text = %q),
    (name = "PREFER", text = %q),
    (name = "EDGE_TOKEN", text = %q),
    (name = "POLL_MS", text = "30"),
    (name = "SWITCH_POLLS", text = "2"),
    (name = "MAX_PEEK", text = "4096"), # the long body of the untouched test streams past it
  ],
);
`, addr, regions, prefer, edgeToken)
	cfgPath := filepath.Join(dir, "edge.capnp")
	if err := os.WriteFile(cfgPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "serve", cfgPath)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	for i := 0; ; i++ {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if i == 200 {
			t.Fatalf("workerd did not listen on %s in 10 s: %s", addr, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "http://" + addr
}

func postTo(t *testing.T, base, auth, body string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", auth)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Tailgate-Region"), string(raw)
}

// waitAnswerFrom posts until want answers (at most 100 tries, 5 s).
func waitAnswerFrom(t *testing.T, base, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; i < 100 && time.Now().Before(deadline); i++ {
		if code, reg, _ := postTo(t, base, "Bearer k", chat); code == 200 && reg == want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the Worker never answered from %s", want)
}

// The Worker passes the edge's selection tests in workerd.
func TestWorkerSelection(t *testing.T) {
	t.Run("expected TTFT beats RTT alone", func(t *testing.T) {
		near := newFakeRegion(t, "near", serving.RegionModel{ID: model, ReadyReplicas: 1, Slots: 1, Inflight: 1, Waiting: 6, TTFTP50: 0.3})
		far := newFakeRegion(t, "far", idle(0.05))
		farURL := delayProxy(t, far.srv.Listener.Addr().String(), 40*time.Millisecond)
		w := startWorker(t, "near="+near.srv.URL+",far="+farURL, "near")
		if code, reg, body := postTo(t, w, "Bearer k", chat); code != 200 || reg != "far" {
			t.Fatalf("busy near, idle far: %d from %q (%s), want 200 from far", code, reg, body)
		}
		if n := len(near.requests()); n != 0 {
			t.Fatalf("the busy near region got %d requests", n)
		}
		near.set(func(st *serving.RegionStatus) { st.Models[0] = idle(0.05) })
		waitAnswerFrom(t, w, "near")
	})
	t.Run("skips an unhealthy region", func(t *testing.T) {
		a := newFakeRegion(t, "a", idle(0.05))
		b := newFakeRegion(t, "b", idle(0.05))
		a.mu.Lock()
		a.down = true
		a.mu.Unlock()
		w := startWorker(t, "a="+a.srv.URL+",b="+b.srv.URL, "a")
		for range 5 {
			if code, reg, _ := postTo(t, w, "Bearer k", chat); code != 200 || reg != "b" {
				t.Fatalf("%d from %q, want 200 from b", code, reg)
			}
		}
		if n := len(a.requests()); n != 0 {
			t.Fatalf("the unhealthy region got %d requests", n)
		}
	})
	t.Run("retries an unsent request in the next region", func(t *testing.T) {
		a := newFakeRegion(t, "a", idle(0.05))
		b := newFakeRegion(t, "b", idle(0.1)) // a clearly first
		w := startWorker(t, "a="+a.srv.URL+",b="+b.srv.URL, "a")
		waitAnswerFrom(t, w, "a")
		a.srv.Close()
		if code, reg, body := postTo(t, w, "Bearer k", chat); code != 200 || reg != "b" {
			t.Fatalf("a's port closed: %d from %q (%s), want 200 from b", code, reg, body)
		}
	})
	t.Run("retries a refused request in the next region", func(t *testing.T) {
		a := newFakeRegion(t, "a", idle(0.05))
		b := newFakeRegion(t, "b", idle(0.1)) // a clearly first
		a.mu.Lock()
		a.refuse = true
		a.mu.Unlock()
		w := startWorker(t, "a="+a.srv.URL+",b="+b.srv.URL, "a")
		if code, reg, body := postTo(t, w, "Bearer k", chat); code != 200 || reg != "b" {
			t.Fatalf("a refuses with 503: %d from %q (%s), want 200 from b", code, reg, body)
		}
		if len(a.requests()) != 1 || len(b.requests()) != 1 {
			t.Fatalf("a got %d, b %d requests; want 1 each (a first, then b)", len(a.requests()), len(b.requests()))
		}
	})
	t.Run("a region without samples is not fastest", func(t *testing.T) {
		// b is 40 ms farther and has no TTFT samples (fresh, restarted):
		// counted as fastest (p50 0) it would win every poll.
		a := newFakeRegion(t, "a", idle(0.5))
		b := newFakeRegion(t, "b", idle(0))
		bURL := delayProxy(t, b.srv.Listener.Addr().String(), 20*time.Millisecond)
		w := startWorker(t, "a="+a.srv.URL+",b="+bURL, "a")
		for i := range 40 { // POLL_MS 30, SWITCH_POLLS 2: many rounds
			if code, reg, body := postTo(t, w, "Bearer k", chat); code != 200 || reg != "a" {
				t.Fatalf("request %d: %d from %q (%s), want 200 from the preferred a", i, code, reg, body)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if n := len(b.requests()); n != 0 {
			t.Fatalf("the region without samples got %d requests", n)
		}
	})
	t.Run("resends an in-flight request of a killed region", func(t *testing.T) {
		a := newFakeRegion(t, "a", idle(0.05))
		b := newFakeRegion(t, "b", idle(0.1)) // a clearly first
		w := startWorker(t, "a="+a.srv.URL+",b="+b.srv.URL, "a")
		waitAnswerFrom(t, w, "a")
		a.mu.Lock()
		a.kill = true
		a.mu.Unlock()
		before := len(a.requests())
		if code, reg, body := postTo(t, w, "Bearer k", chat); code != 200 || reg != "b" {
			t.Fatalf("a killed mid-request: %d from %q (%s), want 200 from b", code, reg, body)
		}
		if n := len(a.requests()) - before; n != 1 {
			t.Fatalf("a got %d requests, want 1 (it died running it)", n)
		}
	})
	t.Run("Authorization and body untouched", func(t *testing.T) {
		a := newFakeRegion(t, "a", idle(0.05))
		w := startWorker(t, "a="+a.srv.URL, "")
		auth := "Bearer sk-tg-Ünïcode  two-spaces=="
		bodies := []string{
			"{ \"model\" : \"llama\",\n\"model\":\"dup\", \"x\":1e400 ,\"messages\":[]}  ",
			`{"model":"llama","messages":[{"role":"user","content":"` + strings.Repeat("ab", 5000) + `"}]}`,
		}
		for _, body := range bodies {
			if code, _, raw := postTo(t, w, auth, body); code != 200 {
				t.Fatalf("answer %d %s", code, raw)
			}
		}
		got := a.requests()
		if len(got) != len(bodies) {
			t.Fatalf("region got %d requests, want %d", len(got), len(bodies))
		}
		for i, r := range got {
			if r.auth != auth || !bytes.Equal(r.body, []byte(bodies[i])) {
				t.Fatalf("request %d reached the region altered: auth %q body %q", i, r.auth, r.body[:min(len(r.body), 80)])
			}
		}
	})
	t.Run("draining moves traffic", func(t *testing.T) {
		a := newFakeRegion(t, "a", idle(0.05))
		b := newFakeRegion(t, "b", idle(0.1)) // a clearly first
		w := startWorker(t, "a="+a.srv.URL+",b="+b.srv.URL, "a")
		waitAnswerFrom(t, w, "a")
		a.set(func(st *serving.RegionStatus) { st.Draining = true })
		waitAnswerFrom(t, w, "b")
		before := len(a.requests())
		for range 5 {
			if code, reg, _ := postTo(t, w, "Bearer k", chat); code != 200 || reg != "b" {
				t.Fatalf("a draining: %d from %q, want 200 from b", code, reg)
			}
		}
		if n := len(a.requests()); n != before {
			t.Fatalf("the draining region got %d new requests", n-before)
		}
	})
}
