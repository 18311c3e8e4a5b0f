package e2e

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestGatewayAloneSaysTheNextSteps: `tailgate gateway` on a new directory,
// with workers as the plan (no --upstream), says where workers register and
// how to make the first key, and warns of no "upstream configured".
func TestGatewayAloneSaysTheNextSteps(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	dir := filepath.Join(t.TempDir(), "gw")
	p := startProc(t, "gateway", true, "gateway", "--data", dir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	var out []string
	p.scanUntil(func(line string) bool {
		out = append(out, line)
		return strings.Contains(line, "no API key yet")
	})
	text := strings.Join(out, "\n")
	for _, want := range []string{"Workers register at http://127.0.0.1:", "tailgate workers invite --data " + dir,
		"tailgate worker --gateway http://127.0.0.1:", "tailgate keys create --data " + dir + " --tenant NAME"} {
		if !strings.Contains(text, want) {
			t.Errorf("the gateway's first lines lack %q:\n%s", want, text)
		}
	}
	if strings.Contains(p.stderr.String(), "no upstream configured") {
		t.Errorf("the gateway warned of no upstream with workers as the plan:\n%s", p.stderr.String())
	}
}

// TestBusyPortLeavesNoDataDirectory: a first start that fails because the
// port is taken leaves no data directory behind (tokens, an empty
// database), so the next try is a first start again.
func TestBusyPortLeavesNoDataDirectory(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	busy := holdPort(t)
	for _, args := range [][]string{{"gateway"}, {"up", "--replicas", "1"}} {
		cmd := args[0]
		dir := filepath.Join(t.TempDir(), cmd)
		code, stderr := runToExit(t, 60*time.Second, append(args, "--data", dir, "--listen", busy, "--admin-listen", "127.0.0.1:0")...)
		if code != 1 || !strings.Contains(stderr, "address already in use") {
			t.Errorf("%s on a busy port: exit %d\n%s", cmd, code, stderr)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			entries, _ := os.ReadDir(dir)
			t.Errorf("%s on a busy port left %s behind (%v): %v", cmd, dir, err, entries)
		}
	}
}
