package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/data"
)

// TestWorkersCommand: `workers list` shows the credentials by id (never a
// hash) and `workers revoke` revokes one by its id or its replica id.
func TestWorkersCommand(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := data.Open(filepath.Join(dir, "tailgate.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	w1, err := st.CreateWorker(ctx, data.Worker{ReplicaID: "worker-1", Address: "http://127.0.0.1:9001", Hash: []byte("h1")})
	if err != nil {
		t.Fatal(err)
	}
	w2, err := st.CreateWorker(ctx, data.Worker{ReplicaID: "worker-2", Address: "http://127.0.0.1:9002", Hash: []byte("h2")})
	if err != nil {
		t.Fatal(err)
	}
	workers := func(args ...string) (string, error) {
		var stdout, stderr bytes.Buffer
		err := run(ctx, append([]string{"workers"}, args...), &stdout, &stderr)
		return stdout.String(), err
	}
	out, err := workers("list", "--data", dir)
	if err != nil || !strings.Contains(out, w1.ID) || !strings.Contains(out, "worker-2") || strings.Contains(out, "revoked") {
		t.Fatalf("list: %v\n%s", err, out)
	}
	if out, err = workers("revoke", "--data", dir, "worker-2"); err != nil || !strings.Contains(out, "revoked "+w2.ID) {
		t.Fatalf("revoke by replica id: %v %s", err, out)
	}
	if _, err = workers("revoke", "--data", dir, w1.ID); err != nil {
		t.Fatalf("revoke by worker id: %v", err)
	}
	if _, err = workers("revoke", "--data", dir, "nosuch"); err == nil {
		t.Error("revoking an unknown worker succeeded")
	}
	out, err = workers("list", "--data", dir, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var list []map[string]any
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 2 {
		t.Fatalf("list --json: %v %s", err, out)
	}
	for _, w := range list {
		if w["revoked_at"] == nil || w["hash"] != nil {
			t.Errorf("listed %v", w)
		}
	}
	if ws, _ := st.Workers(ctx); !ws[0].Revoked() || !ws[1].Revoked() {
		t.Errorf("stored: %+v", ws)
	}
}

// TestWorkersInviteAndApprove: `workers invite` prints a join token that
// admits its replica id once; `workers list` shows a refused id as pending
// and `workers approve` admits it.
func TestWorkersInviteAndApprove(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := data.Open(filepath.Join(dir, "tailgate.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	workers := func(args ...string) (string, error) {
		var stdout, stderr bytes.Buffer
		err := run(ctx, append([]string{"workers"}, args...), &stdout, &stderr)
		return stdout.String(), err
	}
	out, err := workers("invite", "--data", dir, "--replica-id", "gpu-1", "--expires", "10m")
	token := strings.TrimSpace(out)
	if err != nil || !strings.HasPrefix(token, data.JoinTokenPrefix) || strings.Count(out, "\n") != 1 {
		t.Fatalf("invite: %v, stdout %q; want the token alone", err, out)
	}
	if _, err := st.AdmitWorker(ctx, data.Worker{ReplicaID: "gpu-1", Address: "http://10.0.0.1:9000", Hash: []byte("h1")}, data.Admit{JoinToken: token}); err != nil {
		t.Fatalf("the printed token does not admit gpu-1: %v", err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"invite", "--data", dir, "--replica-id", "gpu-1"}, "belongs to worker"},
		{[]string{"invite", "--data", dir}, "--replica-id is required"},
		{[]string{"invite", "--data", dir, "--replica-id", "gpu-2", "--expires", "0s"}, "want a positive duration"},
		{[]string{"invite", "--data", dir, "--replica-id", "a b"}, "without spaces"},
	} {
		if _, err := workers(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("workers %v: %v; want an error saying %q", c.args, err, c.want)
		}
	}

	if err := st.NotePending(ctx, "gpu-3", data.Asked{Address: "http://10.0.0.3:9000"}); err != nil {
		t.Fatal(err)
	}
	out, err = workers("list", "--data", dir)
	if err != nil || !strings.Contains(out, "pending") || !strings.Contains(out, "tailgate workers approve gpu-3") {
		t.Fatalf("list with a pending id: %v\n%s", err, out)
	}
	if out, err = workers("approve", "--data", dir, "gpu-3", "--code", "abcd-efgh-ijkl"); err != nil || !strings.Contains(out, "approved replica gpu-3 for the worker with code ABCD-EFGH-IJKL (the last to ask did from http://10.0.0.3:9000") {
		t.Fatalf("approve: %v %q", err, out)
	}
	if out, err = workers("approve", "--data", dir, "gpu-4", "--code", "ABCD-EFGH-IJKL"); err != nil || !strings.Contains(out, "no worker has asked") {
		t.Fatalf("approve before asking: %v %q", err, out)
	}
	out, err = workers("list", "--data", dir, "--json")
	var list []workerJSON
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].ReplicaID != "gpu-1" || list[0].Status != "active" {
		t.Fatalf("list --json after the approvals: %v %s; want gpu-1 alone, active", err, out)
	}
	if _, err := st.AdmitWorker(ctx, data.Worker{ReplicaID: "gpu-3", Address: "http://10.0.0.3:9000", Hash: []byte("h3")}, data.Admit{Code: "ABCD-EFGH-IJKL"}); err != nil {
		t.Errorf("gpu-3 after the approval: %v", err)
	}
}
