package server_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving"
)

// openRegistration lets the cluster token alone register a new replica
// id: the tests of what a registered worker may do start there (those of
// how one is admitted are in admission_test.go).
var openRegistration = server.Config{OpenRegistration: true}

func admin(t *testing.T, h *servertest.Gateway, method, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, h.Admin.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func readyBeat(id, addr string) serving.Heartbeat {
	return serving.Heartbeat{ReplicaID: id, Address: addr, Models: []string{servertest.SimModel}, State: "ready", Engine: "sim"}
}

// TestWorkerCannotTakeAnotherWorkersReplica: with the cluster token alone,
// or with its own credential, a second worker cannot take the replica id
// or the address a registered worker holds; the first keeps routing.
func TestWorkerCannotTakeAnotherWorkersReplica(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Server: openRegistration, Replicas: 1})
	engine := tokenCheckingEngine(t)
	other := tokenCheckingEngine(t)
	resp, first, _ := beat(h, servertest.ClusterToken, "", readyBeat("w1", engine.URL))
	if resp.StatusCode != 200 || first.Credential == "" || first.WorkerID == "" {
		t.Fatalf("first registration: %d %+v", resp.StatusCode, first)
	}
	resp, second, _ := beat(h, servertest.ClusterToken, "", readyBeat("w2", other.URL))
	if resp.StatusCode != 200 || second.Credential == "" || second.Credential == first.Credential {
		t.Fatalf("second worker's registration: %d", resp.StatusCode)
	}
	for _, c := range []struct {
		name, cred, id, addr, want string
	}{
		{"replica id, token only", "", "w1", other.URL, `replica id "w1" is held by another worker`},
		{"address, token only", "", "w3", engine.URL, "address " + engine.URL + " is held by another worker"},
		{"replica id, other credential", second.Credential, "w1", other.URL, "was registered as replica"},
		{"address, other credential", second.Credential, "w2", engine.URL, "address " + engine.URL + " is held by another worker"},
	} {
		resp, _, msg := beat(h, servertest.ClusterToken, c.cred, readyBeat(c.id, c.addr))
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(msg, c.want) {
			t.Errorf("%s: %d %q; want 403 saying %q", c.name, resp.StatusCode, msg, c.want)
		}
	}
	if rep := h.Reg.Get("w1"); rep == nil || rep.URL != engine.URL || rep.Worker != first.WorkerID {
		t.Fatalf("w1 after the attempts: %+v", rep)
	}
	if resp, _, msg := beat(h, servertest.ClusterToken, first.Credential, readyBeat("w1", engine.URL)); resp.StatusCode != 200 {
		t.Fatalf("the owner's heartbeat: %d %s", resp.StatusCode, msg)
	}
	// The first worker still serves: with the static upstream gone, only
	// it can answer.
	for _, r := range h.Reg.Replicas() {
		if r.Static {
			h.Reg.Remove(r.ID)
		}
	}
	h.Reg.Remove("w2")
	key := h.Key(policy.KeyOptions{})
	res := h.Post("/v1/chat/completions", key, `{"model":"`+servertest.SimModel+`","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`)
	res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("X-Tailgate-Replica") != "w1" {
		t.Fatalf("chat: %d via %q", res.StatusCode, res.Header.Get("X-Tailgate-Replica"))
	}
}

// TestReplicaIDBelongsToItsCredentialUntilRevoked: once a worker's lease
// has ended (it is down, or restarting), its replica id is still its own:
// the cluster token alone cannot take it; the worker itself comes back with
// its credential, at another address too; once the credential is revoked,
// the id can be registered anew after an operator approves it.
func TestReplicaIDBelongsToItsCredentialUntilRevoked(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Server: openRegistration, Replicas: 1})
	engine := tokenCheckingEngine(t)
	moved := tokenCheckingEngine(t)
	_, owner, _ := beat(h, servertest.ClusterToken, "", readyBeat("w1", engine.URL))
	if owner.Credential == "" {
		t.Fatal("no credential issued")
	}
	h.Reg.Remove("w1") // what the lease sweep does when its heartbeats stop

	resp, _, msg := beat(h, servertest.ClusterToken, "", readyBeat("w1", moved.URL))
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(msg, `replica id "w1" belongs to worker `+owner.WorkerID) ||
		!strings.Contains(msg, "tailgate workers revoke "+owner.WorkerID) {
		t.Fatalf("token-only registration of a down worker's id: %d %q; want 403 naming the owner and how to revoke it", resp.StatusCode, msg)
	}
	if h.Reg.Get("w1") != nil {
		t.Fatal("the refused registration is routed")
	}
	resp, back, msg := beat(h, servertest.ClusterToken, owner.Credential, readyBeat("w1", moved.URL))
	if resp.StatusCode != 200 || back.Credential != "" || back.WorkerID != owner.WorkerID {
		t.Fatalf("the owner, back at a new address: %d %+v %q", resp.StatusCode, back, msg)
	}
	if rep := h.Reg.Get("w1"); rep == nil || rep.URL != moved.URL {
		t.Fatalf("w1 after the move: %+v", rep)
	}
	if code, body := admin(t, h, http.MethodGet, "/admin/v1/workers"); code != 200 || !strings.Contains(body, moved.URL) {
		t.Errorf("workers list after the move: %d %s", code, body)
	}

	if code, body := admin(t, h, http.MethodDelete, "/admin/v1/workers/"+owner.WorkerID); code != 200 {
		t.Fatalf("revoke: %d %s", code, body)
	}
	// Revoked, the id stays out (open registration or not) until an
	// operator approves it again.
	resp, _, msg = beat(h, servertest.ClusterToken, "", readyBeat("w1", moved.URL))
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(msg, "tailgate workers approve --data DIR w1") {
		t.Fatalf("token-only registration of a revoked id: %d %q; want 403 saying how to approve it", resp.StatusCode, msg)
	}
	if code, body := admin(t, h, http.MethodPost, "/admin/v1/workers/w1/approve?code="+serving.ApprovalCode(testWorkerKey)); code != 200 {
		t.Fatalf("approve: %d %s", code, body)
	}
	resp, fresh, msg := beat(h, servertest.ClusterToken, "", readyBeat("w1", moved.URL))
	if resp.StatusCode != 200 || fresh.Credential == "" || fresh.WorkerID == owner.WorkerID {
		t.Fatalf("registration after the old credential was revoked and the id approved: %d %+v %q", resp.StatusCode, fresh, msg)
	}
}

// TestHeartbeatCannotTakeAStaticUpstream: a heartbeat naming a configured
// upstream's id or address is refused and the upstream stays as it was.
func TestHeartbeatCannotTakeAStaticUpstream(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Server: openRegistration, Replicas: 1})
	static := h.Reg.Replicas()[0]
	for _, hb := range []serving.Heartbeat{readyBeat(static.ID, "http://127.0.0.1:1"), readyBeat("w1", static.URL)} {
		resp, _, msg := beat(h, servertest.ClusterToken, "", hb)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(msg, "configured upstream") {
			t.Errorf("heartbeat as %s at %s: %d %q", hb.ReplicaID, hb.Address, resp.StatusCode, msg)
		}
	}
	if got := h.Reg.Get(static.ID); got != static || !got.Static || got.State().String() != "ready" {
		t.Fatalf("static upstream after the heartbeats: %+v", got)
	}
	if len(h.Reg.Replicas()) != 1 {
		t.Fatalf("replicas: %d", len(h.Reg.Replicas()))
	}
}

// TestRevokedWorkerIsRefusedAndLeavesRouting: DELETE /admin/v1/workers/ID
// takes the worker out of routing at once and refuses its heartbeats.
func TestRevokedWorkerIsRefusedAndLeavesRouting(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Server: openRegistration, Replicas: 1})
	engine := tokenCheckingEngine(t)
	_, reply, _ := beat(h, servertest.ClusterToken, "", readyBeat("w1", engine.URL))
	if code, body := admin(t, h, http.MethodDelete, "/admin/v1/workers/"+reply.WorkerID); code != 200 || !strings.Contains(body, `"revoked":true`) {
		t.Fatalf("revoke: %d %s", code, body)
	}
	if h.Reg.Get("w1") != nil {
		t.Fatal("revoked worker still routed")
	}
	resp, _, msg := beat(h, servertest.ClusterToken, reply.Credential, readyBeat("w1", engine.URL))
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(msg, "revoked") {
		t.Fatalf("revoked worker's heartbeat: %d %q", resp.StatusCode, msg)
	}
	if h.Reg.Get("w1") != nil {
		t.Fatal("revoked worker's heartbeat put it back")
	}
	if code, _ := admin(t, h, http.MethodDelete, "/admin/v1/workers/wkr_nosuch"); code != http.StatusNotFound {
		t.Errorf("revoking an unknown worker: %d", code)
	}
	// `tailgate workers revoke` revokes in the database: the next heartbeat
	// is refused.
	_, reply2, _ := beat(h, servertest.ClusterToken, "", readyBeat("w2", engine.URL))
	if _, err := h.Store.RevokeWorker(context.Background(), "w2"); err != nil {
		t.Fatal(err)
	}
	if resp, _, msg := beat(h, servertest.ClusterToken, reply2.Credential, readyBeat("w2", engine.URL)); resp.StatusCode != http.StatusForbidden || !strings.Contains(msg, "revoked") {
		t.Fatalf("heartbeat after a revocation in the database: %d %q", resp.StatusCode, msg)
	}
	// An unknown credential (the gateway's data was reset) is told so.
	if resp, _, _ := beat(h, servertest.ClusterToken, "tgw_unknown", readyBeat("w9", "http://127.0.0.1:2")); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("unknown credential: %d", resp.StatusCode)
	}
}

// TestWorkerCredentialIsStoredHashedAndNeverShown: only the credential's
// hash is stored; the admin API names the worker by id.
func TestWorkerCredentialIsStoredHashedAndNeverShown(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Server: openRegistration, Replicas: 1})
	engine := tokenCheckingEngine(t)
	_, reply, _ := beat(h, servertest.ClusterToken, "", readyBeat("w1", engine.URL))
	ws, err := h.Store.Workers(context.Background())
	if err != nil || len(ws) != 1 {
		t.Fatalf("workers: %v %v", ws, err)
	}
	sum := sha256.Sum256([]byte(reply.Credential))
	if w := ws[0]; w.ID != reply.WorkerID || string(w.Hash) != string(sum[:]) || w.ReplicaID != "w1" || w.Address != engine.URL {
		t.Fatalf("stored worker %+v", w)
	}
	for _, path := range []string{"/admin/v1/replicas", "/admin/v1/workers"} {
		code, body := admin(t, h, http.MethodGet, path)
		if code != 200 || strings.Contains(body, reply.Credential) || !strings.Contains(body, reply.WorkerID) {
			t.Errorf("%s: %d, shows the secret or not the worker id: %s", path, code, body)
		}
	}
}

// An admin or heartbeat body sent with a valid token and then trickled
// (here: stalled) is cut at the body timeout, not held open for ever.
func TestAdminAndHeartbeatBodiesHaveADeadline(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Server: server.Config{BodyTimeout: 300 * time.Millisecond}})
	addr := strings.TrimPrefix(h.Admin.URL, "http://")
	for _, tc := range []struct{ path, token string }{
		{"/admin/v1/keys", servertest.AdminToken},
		{serving.HeartbeatPath, servertest.ClusterToken},
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"", tc.path, tc.token)
		start := time.Now()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = io.ReadAll(c) // an answer, then the close; or the close alone
		c.Close()
		if took := time.Since(start); err != nil || took > 5*time.Second {
			t.Fatalf("%s: a stalled body held the connection %s (%v); want it cut after the 300ms body timeout", tc.path, took, err)
		}
	}
}
