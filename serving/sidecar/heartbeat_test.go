package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/serving"
)

// gateway is a stand-in for the gateway's heartbeat endpoint: it checks
// the cluster token and decodes each beat.
type gateway struct {
	srv      *httptest.Server
	beats    chan serving.Heartbeat
	rejected atomic.Int32
	down     atomic.Bool // answer 503 to every beat
}

func startGateway(t *testing.T) *gateway {
	t.Helper()
	g := &gateway{beats: make(chan serving.Heartbeat, 1000)}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != serving.HeartbeatPath {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+testToken {
			g.rejected.Add(1)
			http.Error(w, `{"error":{"message":"bad cluster token"}}`, http.StatusUnauthorized)
			return
		}
		if g.down.Load() {
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
			return
		}
		var hb serving.Heartbeat
		if err := json.NewDecoder(r.Body).Decode(&hb); err != nil || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("undecodable beat (%s): %v", r.Header.Get("Content-Type"), err)
			http.Error(w, "bad beat", http.StatusBadRequest)
			return
		}
		g.beats <- hb
		_ = json.NewEncoder(w).Encode(serving.HeartbeatReply{LeaseSeconds: 3})
	}))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *gateway) next(t *testing.T) serving.Heartbeat {
	t.Helper()
	select {
	case hb := <-g.beats:
		return hb
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for a heartbeat")
		return serving.Heartbeat{}
	}
}

// replica is a worker's view of itself that the test can change.
type replica struct {
	mu    sync.Mutex
	state string
}

func (r *replica) set(state string) {
	r.mu.Lock()
	r.state = state
	r.mu.Unlock()
}

func (r *replica) build() serving.Heartbeat {
	r.mu.Lock()
	defer r.mu.Unlock()
	return serving.Heartbeat{
		ReplicaID: "r1",
		Address:   "http://10.0.0.5:9000",
		Models:    []string{"m"},
		State:     r.state,
		Engine:    "sim",
		Load:      serving.Load{Inflight: 2, Waiting: 1, Running: 4, KVCacheUsage: 0.5, TTFTMillisP50: 12.5},
	}
}

// runHeartbeater runs h.Run until the test ends and checks it returns nil.
func runHeartbeater(t *testing.T, h *Heartbeater) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run = %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func newHeartbeater(t *testing.T, cfg HeartbeatConfig) *Heartbeater {
	t.Helper()
	h, err := NewHeartbeater(cfg)
	if err != nil {
		t.Fatalf("NewHeartbeater: %v", err)
	}
	return h
}

func TestHeartbeatsKeepComing(t *testing.T) {
	g := startGateway(t)
	rep := &replica{state: serving.StateReady}
	var logs logBuffer
	h := newHeartbeater(t, HeartbeatConfig{
		GatewayURL: g.srv.URL + "/", ClusterToken: testToken, Interval: 2 * time.Millisecond,
		Build: rep.build, Log: newLogger(&logs),
	})
	runHeartbeater(t, h)
	for range 5 {
		if hb := g.next(t); !equalBeats(hb, rep.build()) {
			t.Fatalf("gateway got %+v, want %+v", hb, rep.build())
		}
	}
	if n := logs.count("registered with gateway"); n != 1 {
		t.Errorf(`"registered with gateway" logged %d times:\n%s`, n, logs.String())
	}
}

func equalBeats(a, b serving.Heartbeat) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

func TestBeatSendsAtOnce(t *testing.T) {
	g := startGateway(t)
	rep := &replica{state: serving.StateReady}
	h := newHeartbeater(t, HeartbeatConfig{
		GatewayURL: g.srv.URL, ClusterToken: testToken, Interval: time.Hour, Build: rep.build,
	})
	runHeartbeater(t, h)
	if hb := g.next(t); hb.State != serving.StateReady {
		t.Fatalf("first beat state %q", hb.State)
	}
	// The next periodic beat is an hour away: this one is Beat's.
	rep.set(serving.StateDraining)
	if err := h.Beat(context.Background()); err != nil {
		t.Fatalf("Beat: %v", err)
	}
	if hb := g.next(t); hb.State != serving.StateDraining {
		t.Errorf("beat after the state change says %q", hb.State)
	}
}

func TestHeartbeatFailuresAreLoggedOncePerStreak(t *testing.T) {
	g := startGateway(t)
	rep := &replica{state: serving.StateReady}
	var logs logBuffer
	h := newHeartbeater(t, HeartbeatConfig{
		GatewayURL: g.srv.URL, ClusterToken: testToken, Build: rep.build, Log: newLogger(&logs),
	})
	ctx := context.Background()
	beats := func(n int) (err error) {
		for range n {
			err = h.Beat(ctx)
		}
		return err
	}

	if err := beats(2); err != nil {
		t.Fatalf("Beat: %v", err)
	}
	g.down.Store(true)
	if err := beats(3); err == nil {
		t.Fatal("Beat against a failing gateway succeeded")
	}
	g.down.Store(false)
	if err := beats(2); err != nil {
		t.Fatalf("Beat after recovery: %v", err)
	}
	g.down.Store(true)
	_ = beats(2)

	if n := logs.count("heartbeat to gateway failed"); n != 2 {
		t.Errorf("failures logged %d times, want once per streak (2):\n%s", n, logs.String())
	}
	if n := logs.count("registered with gateway"); n != 2 {
		t.Errorf(`"registered with gateway" logged %d times, want at the start and after recovery:\n%s`, n, logs.String())
	}
}

func TestHeartbeatWithAWrongToken(t *testing.T) {
	g := startGateway(t)
	var logs logBuffer
	h := newHeartbeater(t, HeartbeatConfig{
		GatewayURL: g.srv.URL, ClusterToken: "stale-token", Interval: time.Millisecond,
		Build: (&replica{state: serving.StateReady}).build, Log: newLogger(&logs),
	})
	if err := h.Beat(context.Background()); !errors.Is(err, ErrTokenRejected) {
		t.Errorf("Beat = %v, want ErrTokenRejected", err)
	}
	stop := runHeartbeater(t, h)
	testkit.WaitFor(t, "more rejected beats", func() bool { return g.rejected.Load() >= 5 })
	stop()
	if n := logs.count("gateway rejected the cluster token"); n != 1 {
		t.Errorf("rejection logged %d times, want once:\n%s", n, logs.String())
	}
	if len(g.beats) != 0 {
		t.Error("the gateway accepted a beat with the wrong token")
	}
}

func TestHeartbeatToAnUnreachableGateway(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now: connections are refused

	var logs logBuffer
	h := newHeartbeater(t, HeartbeatConfig{
		GatewayURL: url, ClusterToken: testToken,
		Build: (&replica{state: serving.StateReady}).build, Log: newLogger(&logs),
	})
	for range 3 {
		if err := h.Beat(context.Background()); !errors.Is(err, ErrGatewayUnreachable) {
			t.Fatalf("Beat = %v, want ErrGatewayUnreachable", err)
		}
	}
	if n := logs.count("gateway unreachable at " + url); n != 1 {
		t.Errorf("unreachable gateway logged %d times, want once:\n%s", n, logs.String())
	}
}

func TestHeartbeatConfigIsValidated(t *testing.T) {
	build := func() serving.Heartbeat { return serving.Heartbeat{} }
	for name, cfg := range map[string]HeartbeatConfig{
		"no URL":        {ClusterToken: "t", Build: build},
		"not http":      {GatewayURL: "tg-gateway:8081", ClusterToken: "t", Build: build},
		"no token":      {GatewayURL: "http://g:8081", Build: build},
		"no build":      {GatewayURL: "http://g:8081", ClusterToken: "t"},
		"negative tick": {GatewayURL: "http://g:8081", ClusterToken: "t", Build: build, Interval: -1},
	} {
		if _, err := NewHeartbeater(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestKickBeatsAtOnce(t *testing.T) {
	beats := make(chan serving.Heartbeat, 16)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var hb serving.Heartbeat
		_ = json.NewDecoder(r.Body).Decode(&hb)
		beats <- hb
		_, _ = w.Write([]byte(`{"lease_seconds":3.5}`))
	}))
	defer gw.Close()
	var state atomic.Value
	state.Store("starting")
	h, err := NewHeartbeater(HeartbeatConfig{GatewayURL: gw.URL, ClusterToken: "t", Interval: time.Hour,
		Build: func() serving.Heartbeat { return serving.Heartbeat{ReplicaID: "r", State: state.Load().(string)} }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	if hb := <-beats; hb.State != "starting" {
		t.Fatalf("first beat %q", hb.State)
	}
	state.Store("ready")
	h.Kick()
	select {
	case hb := <-beats:
		if hb.State != "ready" {
			t.Fatalf("kicked beat says %q", hb.State)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Kick did not make Run beat (the interval is an hour)")
	}
}

// TestHeartbeatPresentsTheCredentialItWasGiven: the first beat goes with
// the cluster token alone, every later one with the credential the gateway
// answered; a gateway that no longer knows it gets a fresh registration.
func TestHeartbeatPresentsTheCredentialItWasGiven(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	forget := false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		cred := r.Header.Get(serving.HeaderWorkerCredential)
		seen = append(seen, cred)
		switch {
		case forget && cred != "":
			forget = false
			http.Error(w, `{"error":{"code":"invalid_worker_credential","message":"unknown"}}`, http.StatusUnauthorized)
		case cred == "":
			_ = json.NewEncoder(w).Encode(serving.HeartbeatReply{LeaseSeconds: 3, WorkerID: "wkr_1", Credential: "tgw_secret"})
		default:
			_ = json.NewEncoder(w).Encode(serving.HeartbeatReply{LeaseSeconds: 3, WorkerID: "wkr_1"})
		}
	}))
	t.Cleanup(srv.Close)
	rep := &replica{state: serving.StateReady}
	h := newHeartbeater(t, HeartbeatConfig{GatewayURL: srv.URL, ClusterToken: testToken, Interval: time.Hour, Build: rep.build})
	ctx := context.Background()
	for range 2 {
		if err := h.Beat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	forget = true
	mu.Unlock()
	if err := h.Beat(ctx); !errors.Is(err, ErrCredentialUnknown) {
		t.Fatalf("beat with a credential the gateway forgot: %v", err)
	}
	if err := h.Beat(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"", "tgw_secret", "tgw_secret", ""}
	if len(seen) != len(want) {
		t.Fatalf("credentials presented %q; want %q", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("credentials presented %q; want %q", seen, want)
		}
	}
}
