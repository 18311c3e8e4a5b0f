package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data/pgtest"
	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestNewWorkerJoinsWithAnInviteOrAnApproval: with the real binary, a
// worker started with the join token `tailgate workers invite` printed is
// routed at once; one with the cluster token alone is refused, says once
// what the operator must run, is listed pending, and joins by itself once
// `tailgate workers approve` admits it; the spent invite admits nobody
// else.
func TestNewWorkerJoinsWithAnInviteOrAnApproval(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	g := startGateway(t, "--slow-start", "0")

	token := testkit.LastLine(tailgate(t, "workers", "invite", "--data", g.dir, "--replica-id", "w1", "--expires", "10m"))
	if !strings.HasPrefix(token, "tgj_") {
		t.Fatalf("invite printed %q, want a tgj_ token", token)
	}
	tokenFile := filepath.Join(t.TempDir(), "join.token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g.startUnapprovedWorker("w1", "--join-token-file", tokenFile)
	g.waitReady("w1")

	w2 := g.startUnapprovedWorker("w2")
	const says = "tailgate workers approve --data DIR w2"
	testkit.WaitWithin(t, 20*time.Second, "w2 told how it gets in", func() bool { return strings.Contains(w2.stderr.String(), says) })
	var list []struct {
		ReplicaID string `json:"replica_id"`
		Status    string `json:"status"`
	}
	if err := json.Unmarshal([]byte(tailgate(t, "workers", "list", "--data", g.dir, "--json")), &list); err != nil {
		t.Fatal(err)
	}
	status := map[string]string{}
	for _, w := range list {
		status[w.ReplicaID] = w.Status
	}
	if status["w1"] != "active" || status["w2"] != "pending" {
		t.Fatalf("workers list: %+v; want w1 active, w2 pending", list)
	}
	// The spent invite admits no other box.
	w3 := g.startUnapprovedWorker("w3", "--join-token-file", tokenFile)
	testkit.WaitWithin(t, 20*time.Second, "w3 refused with the spent invite", func() bool {
		return strings.Contains(w3.stderr.String(), "was used") && strings.Contains(w3.stderr.String(), "tailgate workers invite --data DIR --replica-id w3")
	})
	if st := g.state("w2"); st != "gone" {
		t.Fatalf("w2 registered with the cluster token alone: %s", st)
	}
	// Said once while refused, not at every retry.
	if n := strings.Count(w2.stderr.String(), "waiting for the operator to admit this worker"); n != 1 {
		t.Errorf("w2 said it waits %d times; want once:\n%s", n, w2.stderr.String())
	}

	// The code w2 prints is the one its key has, and what the list shows.
	approval := testkit.LastLine(tailgate(t, "workers", "code", "--worker-data", filepath.Join(g.dir, "w2")))
	if !strings.Contains(w2.stderr.String(), says+" --code "+approval) {
		t.Fatalf("w2 does not print its approval code %s:\n%s", approval, w2.stderr.String())
	}
	out := g.approve("w2", filepath.Join(g.dir, "w2"))
	if !strings.Contains(out, "approved replica w2") {
		t.Fatalf("approve printed %q", out)
	}
	g.waitReady("w2") // its retry loop gets in by itself
	if st := g.state("w3"); st != "gone" {
		t.Fatalf("w3 registered with a spent invite: %s", st)
	}
	code, _, _, err := g.chat(context.Background(), false, 3)
	if err != nil || code != 200 {
		t.Fatalf("chat through the joined workers: %d %v", code, err)
	}
}

// TestRestartedWorkerKeepsItsReplicaID: a worker keeps its credential in
// its --data directory, so after a SIGKILL it comes back as the same
// replica — at another address, with the same worker id — while another
// process holding the cluster token cannot take that replica id, even
// while the owner is down; it is told whose id it is and how to free it.
func TestRestartedWorkerKeepsItsReplicaID(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	g := startGateway(t)
	w := g.startWorker("w1")
	g.waitReady("w1")
	before := g.replica("w1")
	if before.Worker == "" {
		t.Fatalf("no worker id: %+v", before)
	}
	if fi, err := os.Stat(filepath.Join(g.dir, "w1", "credential-w1")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("credential file: %v %v", fi, err)
	}
	if err := w.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testkit.WaitWithin(t, 15*time.Second, "killed worker's lease ended", func() bool { return g.state("w1") == "lost" })

	// Not the owner: the same replica id, its own --data.
	impostor := startProc(t, "impostor", false, "worker", "--gateway", g.admin,
		"--cluster-token-file", filepath.Join(g.dir, "cluster.token"), "--engine", "sim", "--listen", "127.0.0.1:0",
		"--replica-id", "w1", "--data", filepath.Join(g.dir, "impostor"), "--warmup", "0")
	testkit.WaitWithin(t, 20*time.Second, "the impostor is told the id is taken", func() bool {
		return strings.Contains(impostor.stderr.String(), "belongs to worker "+before.Worker)
	})
	if st := g.state("w1"); st != "lost" {
		t.Fatalf("the impostor registered w1: %s", st)
	}
	_ = impostor.Stop(0)

	g.startWorker("w1") // the owner again: same --data, a new port
	g.waitReady("w1")
	after := g.replica("w1")
	if after.Worker != before.Worker || after.Address == before.Address {
		t.Fatalf("restarted worker: %+v, before %+v; want the same worker id at a new address", after, before)
	}
}

// startGatewayPair starts two gateways on one PostgreSQL database, as two
// gateway boxes of one deployment: the second gets the first's cluster
// token (copied into its data directory before it starts, as the README
// says), so workers hold one token for both. extra goes to both.
func startGatewayPair(t *testing.T, url string, extra ...string) (a, b *gatewayProcess) {
	t.Helper()
	args := append([]string{"--database", url}, extra...)
	a = startGatewayIn(t, t.TempDir(), args...)
	dirB := t.TempDir()
	tok, err := os.ReadFile(filepath.Join(a.dir, "cluster.token"))
	if err == nil {
		err = os.WriteFile(filepath.Join(dirB, "cluster.token"), tok, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	b = startGatewayIn(t, dirB, args...)
	return a, b
}

// TestWorkerRegistersWithEveryGateway: one worker given --gateway twice is
// routed to by both gateways; on a shared PostgreSQL it holds one
// credential for both (the second gateway accepts the first's); and when
// one gateway dies the other keeps the replica and serves through it, while
// the worker's log names the gateway it cannot reach.
func TestWorkerRegistersWithEveryGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary and a PostgreSQL server")
	}
	gA, gB := startGatewayPair(t, pgtest.NewDatabase(t))
	w := gA.startWorker("w1", "--gateway", gB.admin)
	gA.waitReady("w1")
	gB.waitReady("w1")
	for _, g := range []*gatewayProcess{gA, gB} {
		status, h, body, err := g.chat(t.Context(), false, 4)
		if err != nil || status != 200 || h.Get("x-tailgate-replica") != "w1" {
			t.Fatalf("chat through %s: %d %v replica %q\n%s", g.api, status, err, h.Get("x-tailgate-replica"), body)
		}
	}
	var workerA, workerB string
	for _, r := range gA.replicas() {
		if r.ID == "w1" {
			workerA = r.Worker
		}
	}
	for _, r := range gB.replicas() {
		if r.ID == "w1" {
			workerB = r.Worker
		}
	}
	if workerA == "" || workerA != workerB {
		t.Errorf("worker credential on gateway A %q, on B %q: gateways sharing a database share the worker's credential", workerA, workerB)
	}
	creds, _ := filepath.Glob(filepath.Join(gA.dir, "w1", "credential-w1@*"))
	if len(creds) != 2 {
		t.Errorf("credential files %v: want one per gateway", creds)
	}

	if err := gA.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-gA.Done()
	hostA := strings.TrimPrefix(gA.admin, "http://")
	testkit.WaitWithin(t, 20*time.Second, "the worker's log names the gateway it cannot reach", func() bool {
		return strings.Contains(w.stderr.String(), "gateway unreachable at http://"+hostA)
	})
	// Beats keep going to B: the replica outlives several of its leases
	// there. A bounded number of chats, each one beat apart.
	for i := range 8 {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		status, h, body, err := gB.chat(ctx, i%2 == 0, 4)
		cancel()
		if err != nil || status != 200 || h.Get("x-tailgate-replica") != "w1" {
			t.Fatalf("chat %d through gateway B after A died: %d %v replica %q\n%s", i, status, err, h.Get("x-tailgate-replica"), body)
		}
		time.Sleep(time.Second)
	}
	if st := gB.state("w1"); st != "ready" {
		t.Fatalf("gateway B shows w1 %s after A died, want ready", st)
	}
}

// TestWorkerSendsTheClusterTokenFromTheEnvironment: the real binary's
// worker, given no token flag, heartbeats with $TAILGATE_CLUSTER_TOKEN;
// given --cluster-token-file as well, with the file's token.
func TestWorkerSendsTheClusterTokenFromTheEnvironment(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	// Tokens long enough to be accepted (policy.CheckToken).
	fromEnv, fromFile := "tgc-from-env-"+strings.Repeat("e", 43), "tgc-from-file-"+strings.Repeat("f", 43)
	file := filepath.Join(t.TempDir(), "cluster.token")
	if err := os.WriteFile(file, []byte(fromFile+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		extra []string
		want  string
	}{
		{"environment", nil, "Bearer " + fromEnv},
		{"file wins", []string{"--cluster-token-file", file}, "Bearer " + fromFile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			auth := make(chan string, 16)
			gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				select {
				case auth <- r.Header.Get("Authorization"):
				default:
				}
				http.Error(w, `{"error":{"message":"test gateway","type":"invalid_request_error"}}`, http.StatusUnauthorized)
			}))
			defer gw.Close()
			args := append([]string{"worker", "--data", t.TempDir(), "--gateway", gw.URL, "--engine", "sim",
				"--listen", "127.0.0.1:0", "--warmup", "0"}, tc.extra...)
			cmd := exec.Command(binPath, args...)
			cmd.Env = append(os.Environ(), "TAILGATE_CLUSTER_TOKEN="+fromEnv)
			var stderr testkit.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			// SIGTERM, so the worker stops its engine (a child in its own
			// process group) instead of leaving it behind.
			defer func() {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-exited:
				case <-time.After(30 * time.Second):
					_ = cmd.Process.Kill()
					<-exited
				}
			}()
			select {
			case err := <-exited:
				exited <- err
				t.Fatalf("the worker exited (%v) before its first heartbeat; stderr:\n%s", err, stderr.String())
			case got := <-auth:
				if got != tc.want {
					t.Errorf("heartbeat Authorization %q, want %q", got, tc.want)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("no heartbeat within 30s; stderr:\n%s", stderr.String())
			}
			if strings.Contains(stderr.String(), "tgc-from") {
				t.Errorf("the worker logged the cluster token:\n%s", stderr.String())
			}
		})
	}
}
