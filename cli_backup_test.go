package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/data"
)

func TestBackupCommand(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	out := filepath.Join(dir, "copy.db")
	backup := func(args ...string) (string, string, error) {
		var stdout, stderr bytes.Buffer
		err := run(ctx, append([]string{"backup"}, args...), &stdout, &stderr)
		return stdout.String(), stderr.String(), err
	}

	// A directory without a database is refused, and none is created.
	if _, _, err := backup("--data", dataDir, out); err == nil || !strings.Contains(err.Error(), "no database") {
		t.Errorf("backup of a directory without a database: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "tailgate.db")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused backup created a database: %v", err)
	}
	if _, _, err := backup("--data", dataDir); !errors.Is(err, errUsage) {
		t.Errorf("backup without FILE = %v, want a usage error", err)
	}

	st, err := data.Open(filepath.Join(dataDir, "tailgate.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.EnsureTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}

	stdout, _, err := backup("--data", dataDir, out)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	if want := out + "\t" + strconv.FormatInt(fi.Size(), 10) + " bytes\n"; stdout != want {
		t.Errorf("stdout = %q, want %q", stdout, want)
	}
	// An existing FILE is refused unless --force, and left alone.
	if _, _, err := backup("--data", dataDir, out); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("backup over an existing file: %v", err)
	}
	if _, err := st.EnsureTenant(ctx, "beta"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := backup(out, "--force", "--data", dataDir); err != nil {
		t.Fatalf("backup --force (flags after FILE): %v", err)
	}
	cp, err := data.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	ts, err := cp.Tenants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 {
		t.Errorf("the forced copy has %d tenants, want both", len(ts))
	}
}
