package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving"
)

// workerList is GET /admin/v1/workers by replica id and status.
func workerList(t *testing.T, h *servertest.Gateway) map[string]string {
	t.Helper()
	code, body := admin(t, h, http.MethodGet, "/admin/v1/workers")
	if code != 200 {
		t.Fatalf("GET /admin/v1/workers: %d %s", code, body)
	}
	var out struct {
		Data []struct {
			ReplicaID string `json:"replica_id"`
			Status    string `json:"status"`
			Address   string `json:"address"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, w := range out.Data {
		if m[w.ReplicaID] == "" || w.Status == "active" {
			m[w.ReplicaID] = w.Status
		}
	}
	return m
}

func joinHeader(token string) http.Header {
	return http.Header{serving.HeaderJoinToken: {token}}
}

// TestClusterTokenAloneCannotRegisterANewReplica: a new replica id with
// only the cluster token is refused with worker_not_approved, naming the
// command that lets it in, and is listed as pending; once approved over
// the admin API, the worker's next beat registers it.
func TestClusterTokenAloneCannotRegisterANewReplica(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	engine := tokenCheckingEngine(t)
	resp, _, code, msg := beatWith(h, servertest.ClusterToken, nil, readyBeat("gpu-9", engine.URL))
	if resp.StatusCode != http.StatusForbidden || code != "worker_not_approved" ||
		!strings.Contains(msg, "tailgate workers approve --data DIR gpu-9") || !strings.Contains(msg, "tailgate workers invite --data DIR --replica-id gpu-9") {
		t.Fatalf("token-only registration: %d %s %q; want 403 worker_not_approved naming approve and invite", resp.StatusCode, code, msg)
	}
	if h.Reg.Get("gpu-9") != nil {
		t.Fatal("the refused replica is routed")
	}
	if ws, _ := h.Store.Workers(context.Background()); len(ws) != 0 {
		t.Fatalf("a credential was stored for the refused worker: %+v", ws)
	}
	if st := workerList(t, h)["gpu-9"]; st != "pending" {
		t.Fatalf("gpu-9 in the workers list: %q, want pending", st)
	}
	if code, body := admin(t, h, http.MethodPost, "/admin/v1/workers/gpu-9/approve?code="+serving.ApprovalCode(testWorkerKey)); code != 200 || !strings.Contains(body, `"was":"pending"`) {
		t.Fatalf("approve: %d %s", code, body)
	}
	resp, reply, code, msg := beatWith(h, servertest.ClusterToken, nil, readyBeat("gpu-9", engine.URL))
	if resp.StatusCode != 200 || reply.Credential == "" {
		t.Fatalf("after the approval: %d %s %q", resp.StatusCode, code, msg)
	}
	if h.Reg.Get("gpu-9") == nil {
		t.Fatal("the approved replica is not routed")
	}
	if st := workerList(t, h)["gpu-9"]; st != "active" {
		t.Errorf("gpu-9 after the approval: %q, want active", st)
	}
	if code, _ := admin(t, h, http.MethodPost, "/admin/v1/workers/bad%20id/approve"); code != http.StatusBadRequest {
		t.Errorf("approving a malformed id: %d, want 400", code)
	}
}

// TestInviteRegistersItsReplicaOnce: a join token admits the replica id it
// was made for, once: not another id, not a second time.
func TestInviteRegistersItsReplicaOnce(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	engine := tokenCheckingEngine(t)
	other := tokenCheckingEngine(t)
	_, token, err := h.Store.CreateInvite(context.Background(), "gpu-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	resp, _, code, msg := beatWith(h, servertest.ClusterToken, joinHeader(token), readyBeat("gpu-2", other.URL))
	if resp.StatusCode != http.StatusForbidden || code != "invalid_join_token" || !strings.Contains(msg, `for replica id "gpu-1"`) {
		t.Fatalf("the invite for another id: %d %s %q", resp.StatusCode, code, msg)
	}
	resp, first, code, msg := beatWith(h, servertest.ClusterToken, joinHeader(token), readyBeat("gpu-1", engine.URL))
	if resp.StatusCode != 200 || first.Credential == "" {
		t.Fatalf("registration with the invite: %d %s %q", resp.StatusCode, code, msg)
	}
	if h.Reg.Get("gpu-1") == nil {
		t.Fatal("the invited replica is not routed")
	}
	// Its later beats need only its credential; the spent token beside it
	// does no harm.
	if resp, _, code, msg := beatWith(h, servertest.ClusterToken, http.Header{serving.HeaderWorkerCredential: {first.Credential},
		serving.HeaderJoinToken: {token}}, readyBeat("gpu-1", engine.URL)); resp.StatusCode != 200 {
		t.Fatalf("the invited worker's next beat: %d %s %q", resp.StatusCode, code, msg)
	}
	// Once revoked, the same invite does not let it back.
	if code, body := admin(t, h, http.MethodDelete, "/admin/v1/workers/"+first.WorkerID); code != 200 {
		t.Fatalf("revoke: %d %s", code, body)
	}
	resp, _, code, msg = beatWith(h, servertest.ClusterToken, joinHeader(token), readyBeat("gpu-1", engine.URL))
	if resp.StatusCode != http.StatusForbidden || code != "invalid_join_token" || !strings.Contains(msg, "was used") ||
		!strings.Contains(msg, "tailgate workers invite --data DIR --replica-id gpu-1") {
		t.Fatalf("the invite used again: %d %s %q", resp.StatusCode, code, msg)
	}
	if h.Reg.Get("gpu-1") != nil {
		t.Fatal("the revoked worker is routed again")
	}
	// A new invite lets it back.
	_, again, err := h.Store.CreateInvite(context.Background(), "gpu-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if resp, _, code, msg := beatWith(h, servertest.ClusterToken, joinHeader(again), readyBeat("gpu-1", engine.URL)); resp.StatusCode != 200 {
		t.Fatalf("a new invite after the revocation: %d %s %q", resp.StatusCode, code, msg)
	}
}

// TestRevokedWorkerCannotComeBackByItself: a revoked worker's replica id is
// refused with its old credential and with the cluster token alone, even
// with open registration, until an operator approves it again.
func TestRevokedWorkerCannotComeBackByItself(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Server: openRegistration, Replicas: 1})
	engine := tokenCheckingEngine(t)
	resp, reply, _, msg := beatWith(h, servertest.ClusterToken, nil, readyBeat("w1", engine.URL))
	if resp.StatusCode != 200 {
		t.Fatalf("open registration: %d %q", resp.StatusCode, msg)
	}
	if code, body := admin(t, h, http.MethodDelete, "/admin/v1/workers/"+reply.WorkerID); code != 200 {
		t.Fatalf("revoke: %d %s", code, body)
	}
	for i := range 3 {
		for _, cred := range []string{reply.Credential, ""} {
			resp, _, code, msg := beatWith(h, servertest.ClusterToken, http.Header{serving.HeaderWorkerCredential: {cred}}, readyBeat("w1", engine.URL))
			if resp.StatusCode != http.StatusForbidden || code != "worker_revoked" {
				t.Fatalf("beat %d of the revoked worker (credential %v): %d %s %q", i, cred != "", resp.StatusCode, code, msg)
			}
		}
	}
	if h.Reg.Get("w1") != nil {
		t.Fatal("the revoked worker is routed")
	}
	if _, _, err := h.Store.ApproveWorker(context.Background(), "w1", serving.ApprovalCode(testWorkerKey)); err != nil { // `tailgate workers approve w1`
		t.Fatal(err)
	}
	if resp, _, code, msg := beatWith(h, servertest.ClusterToken, nil, readyBeat("w1", engine.URL)); resp.StatusCode != 200 {
		t.Fatalf("after the approval: %d %s %q", resp.StatusCode, code, msg)
	}
}

// TestOpenRegistrationAndAllowedPeersAdmitANewReplica: with
// OpenRegistration (--open-registration), or from a tailnet peer the
// gateway's allow list accepts, the cluster token alone registers a new id.
func TestOpenRegistrationAndAllowedPeersAdmitANewReplica(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  server.Config
		want int
	}{
		{"closed", server.Config{}, http.StatusForbidden},
		{"open registration", server.Config{OpenRegistration: true}, 200},
		{"peer on the allow list", server.Config{PeerCheck: func(*http.Request) error { return nil }}, 200},
		{"peer off the allow list", server.Config{PeerCheck: func(*http.Request) error { return errors.New("tailnet peer x is not in --mesh-allow-peers") }}, http.StatusForbidden},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := servertest.Start(t, servertest.Options{Server: c.cfg, Replicas: 1})
			engine := tokenCheckingEngine(t)
			resp, _, code, msg := beatWith(h, servertest.ClusterToken, nil, readyBeat("w1", engine.URL))
			if resp.StatusCode != c.want {
				t.Fatalf("token-only registration: %d %s %q, want %d", resp.StatusCode, code, msg, c.want)
			}
			if routed := h.Reg.Get("w1") != nil; routed != (c.want == 200) {
				t.Errorf("routed: %v", routed)
			}
		})
	}
}
