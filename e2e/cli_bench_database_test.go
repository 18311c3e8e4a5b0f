package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tailgate/bench/load"
	"tailgate/data/pglocal"
	"tailgate/data/pgtest"
)

// TestBenchScenarioDatabases runs `bench --scenario databases` short: one
// gateway on SQLite and two gateways on a throwaway PostgreSQL serve the
// same seeded requests; the report sets them side by side with
// PostgreSQL/SQLite ratios, every request was answered on both sides, and
// each ledger billed exactly the answers and tokens the clients received.
func TestBenchScenarioDatabases(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary and PostgreSQL")
	}
	if _, err := pglocal.BinDir(); err != nil {
		if os.Getenv(pgtest.SkipEnv) == "skip" {
			t.Skipf("%v (skipped: %s=skip)", err, pgtest.SkipEnv)
		}
		t.Fatal(err)
	}
	jsonPath := filepath.Join(t.TempDir(), "r.json")
	cmd := exec.Command(binPath, "bench", "--scenario", "databases", "--rate", "30", "--phases", "steady:3s",
		"--json", jsonPath)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("bench: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
		}
	case <-time.After(3 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("bench did not finish in 3 minutes\nstderr:\n%s", stderr.String())
	}
	out := stdout.String()
	t.Logf("stdout:\n%s", out)
	for _, want := range []string{"== compare: A = A: 1 gateway on SQLite, B = B: 2 gateways on one PostgreSQL",
		"matched: seed 1", "ttft p99", "total p99", "ledger: ", "match\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	if !strings.Contains(stderr.String(), "starting 2 gateways") {
		t.Errorf("stderr does not say side B started two gateways:\n%s", stderr.String())
	}

	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var cmp load.Comparison
	if err := json.Unmarshal(raw, &cmp); err != nil {
		t.Fatal(err)
	}
	if !cmp.Matched {
		t.Errorf("the two sides were not sent the same requests")
	}
	for _, rep := range []*load.Report{cmp.A, cmp.B} {
		if rep == nil {
			t.Fatal("the JSON report lacks a side")
		}
		if len(rep.Requests) == 0 || rep.All.Errors != 0 {
			t.Errorf("%s: %d requests, %d errors (%v): want every request answered", rep.Label, len(rep.Requests), rep.All.Errors, rep.All.ErrorsByClass)
		}
		l := rep.Ledger
		if l == nil {
			t.Errorf("%s: no ledger check in the report", rep.Label)
			continue
		}
		if !l.Match || l.Requests != int64(len(rep.Requests)) || l.Answers != len(rep.Requests) || l.CompletionTokens == 0 {
			t.Errorf("%s: ledger %+v for %d requests sent: want every request billed once, token for token", rep.Label, *l, len(rep.Requests))
		}
		if rep.All.TTFT.N == 0 || rep.All.Total.N != len(rep.Requests) {
			t.Errorf("%s: ttft over %d, total over %d of %d requests", rep.Label, rep.All.TTFT.N, rep.All.Total.N, len(rep.Requests))
		}
	}
}

// TestBenchScenarioDatabasesWithoutPostgres: without PostgreSQL binaries
// the scenario stops before starting anything, exits non-zero and names
// the package to install.
func TestBenchScenarioDatabasesWithoutPostgres(t *testing.T) {
	cmd := exec.Command(binPath, "bench", "--scenario", "databases", "--phases", "steady:1s")
	cmd.Env = append(os.Environ(), pglocal.BinDirEnv+"="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "apt-get install -y postgresql") {
		t.Fatalf("bench --scenario databases without PostgreSQL = %v:\n%s\nwant an error naming the postgresql package", err, out)
	}
	if strings.Contains(string(out), "simulated replica") {
		t.Errorf("a fleet was started before PostgreSQL was found:\n%s", out)
	}
}
