package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/serving"
)

// TestNotApprovedWorkerSaysOnceWhatToRunAndGetsInWhenApproved: refused
// with worker_not_approved, the heartbeater logs one line naming the
// operator's commands however often it retries, and registers at the first
// beat after the approval.
func TestNotApprovedWorkerSaysOnceWhatToRunAndGetsInWhenApproved(t *testing.T) {
	var approved atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !approved.Load() {
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"error":{"code":"worker_not_approved","message":"replica id \"gpu-1\" is not approved"}}`))
			return
		}
		_ = json.NewEncoder(w).Encode(serving.HeartbeatReply{LeaseSeconds: 3, Credential: "tgw_x", WorkerID: "wkr_1"})
	}))
	defer srv.Close()
	var logs syncLog
	h, err := NewHeartbeater(HeartbeatConfig{GatewayURL: srv.URL, ClusterToken: testToken, Log: slog.New(slog.NewTextHandler(&logs, nil)),
		Build: func() serving.Heartbeat { return serving.Heartbeat{ReplicaID: "gpu-1", State: serving.StateReady} }})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := h.Beat(context.Background()); !errors.Is(err, ErrNotApproved) {
			t.Fatalf("beat: %v, want ErrNotApproved", err)
		}
	}
	if n := strings.Count(logs.String(), "waiting for the operator"); n != 1 || !strings.Contains(logs.String(), "tailgate workers approve --data DIR gpu-1") {
		t.Fatalf("%d lines say it waits; want one naming the approve command:\n%s", n, logs.String())
	}
	approved.Store(true)
	if err := h.Beat(context.Background()); err != nil || h.Credential() != "tgw_x" {
		t.Fatalf("beat after the approval: %v, credential %q", err, h.Credential())
	}
	if !strings.Contains(logs.String(), "registered with gateway") {
		t.Errorf("no line says it registered:\n%s", logs.String())
	}
}

// TestJoinTokenIsSentUntilTheWorkerHasACredential: the join token goes
// with the beats that register, never once a credential is held.
func TestJoinTokenIsSentUntilTheWorkerHasACredential(t *testing.T) {
	var mu sync.Mutex
	var seen [][2]string // join token, credential of each beat
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, [2]string{r.Header.Get(serving.HeaderJoinToken), r.Header.Get(serving.HeaderWorkerCredential)})
		mu.Unlock()
		reply := serving.HeartbeatReply{LeaseSeconds: 3}
		if r.Header.Get(serving.HeaderWorkerCredential) == "" {
			reply.Credential = "tgw_x"
		}
		_ = json.NewEncoder(w).Encode(reply)
	}))
	defer srv.Close()
	h, err := NewHeartbeater(HeartbeatConfig{GatewayURL: srv.URL, ClusterToken: testToken, JoinToken: "tgj_secret",
		Build: func() serving.Heartbeat { return serving.Heartbeat{ReplicaID: "gpu-1", State: serving.StateReady} }})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := h.Beat(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := [][2]string{{"tgj_secret", ""}, {"", "tgw_x"}, {"", "tgw_x"}}
	if len(seen) != 3 || seen[0] != want[0] || seen[1] != want[1] || seen[2] != want[2] {
		t.Fatalf("beats carried (join token, credential) %v, want %v", seen, want)
	}
}

// syncLog is a log sink safe for the heartbeater's goroutines.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestAPublicListenerStopsTheHeartbeater: a gateway URL that answers 404
// to the registration (the gateway's public listener) ends Run at once
// with ErrNotAdminListener, saying to point --gateway at the admin
// listener and what the gateway said; once registered, a 404 is only a
// failed beat (a proxy in between may come back).
func TestAPublicListenerStopsTheHeartbeater(t *testing.T) {
	var registered atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if registered.Load() {
			_ = json.NewEncoder(w).Encode(serving.HeartbeatReply{LeaseSeconds: 3, Credential: "tgw_x", WorkerID: "wkr_1"})
			return
		}
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":{"code":"not_found","message":"this is the gateway's public API listener"}}`))
	}))
	defer srv.Close()
	build := func() serving.Heartbeat { return serving.Heartbeat{ReplicaID: "gpu-1", State: serving.StateReady} }
	h, err := NewHeartbeater(HeartbeatConfig{GatewayURL: srv.URL, ClusterToken: testToken, Build: build})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = h.Run(ctx)
	if !errors.Is(err, ErrNotAdminListener) || ctx.Err() != nil {
		t.Fatalf("Run = %v, want ErrNotAdminListener at once", err)
	}
	for _, w := range []string{srv.URL, "404", "point --gateway at the gateway's admin listener", "public API listener"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the error does not say %q: %v", w, err)
		}
	}

	registered.Store(true)
	if err := h.Beat(ctx); err != nil {
		t.Fatal(err)
	}
	registered.Store(false)
	if err := h.Beat(ctx); !errors.Is(err, ErrNotAdminListener) {
		t.Fatalf("beat: %v", err)
	}
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	if err := h.Run(short); err != nil {
		t.Fatalf("Run after a registration = %v, want it to go on until its context ends", err)
	}
}
