package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestInitPreparesADataDirectory: `tailgate init --data DIR` makes the
// directory, both tokens (0600) and a migrated database, so `keys create`
// works before any gateway ran; run again it keeps every token as it was.
func TestInitPreparesADataDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "fresh", "tailgate-data")
	ctx := context.Background()
	var out, errOut bytes.Buffer

	// Before init, keys create refuses and says what to run.
	if err := run(ctx, []string{"keys", "create", "--data", dir, "--tenant", "team-a"}, &out, &errOut); err == nil {
		t.Fatal("keys create on a directory that was never prepared succeeded")
	} else if !strings.Contains(err.Error(), "tailgate init --data "+dir) {
		t.Errorf("keys create before init: %v; want it to name `tailgate init --data %s`", err, dir)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("keys create made %s (%v)", dir, err)
	}

	if err := run(ctx, []string{"init", "--data", dir}, &out, &errOut); err != nil {
		t.Fatalf("init: %v\n%s", err, errOut.String())
	}
	if got := strings.Count(out.String(), "(created"); got != 3 {
		t.Errorf("first init said created %d times, want 3 (two tokens, the database):\n%s", got, out.String())
	}
	tokens := map[string]string{}
	for _, name := range []string{"admin.token", "cluster.token", "tailgate.db"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm != 0o600 {
			t.Errorf("%s has mode %04o, want 0600", name, perm)
		}
		raw, _ := os.ReadFile(filepath.Join(dir, name))
		tokens[name] = string(raw)
	}

	out.Reset()
	if err := run(ctx, []string{"init", "--data", dir}, &out, &errOut); err != nil {
		t.Fatalf("second init: %v", err)
	}
	if strings.Contains(out.String(), "(created") || strings.Count(out.String(), "(kept") != 3 {
		t.Errorf("second init:\n%s\nwant everything kept", out.String())
	}
	for _, name := range []string{"admin.token", "cluster.token"} {
		if raw, _ := os.ReadFile(filepath.Join(dir, name)); string(raw) != tokens[name] {
			t.Errorf("a second init changed %s", name)
		}
	}

	out.Reset()
	if err := run(ctx, []string{"keys", "create", "--data", dir, "--tenant", "team-a"}, &out, &errOut); err != nil {
		t.Fatalf("keys create after init: %v\n%s", err, errOut.String())
	}
	if !strings.HasPrefix(testkit.LastLine(out.String()), "tg-") {
		t.Errorf("keys create printed %q; want the secret last", out.String())
	}
}
