package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"tailgate/data"
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
