package launcher

import (
	"bufio"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A worker killed with SIGKILL cannot remove its engine socket directory;
// the next launcher on the box does, and leaves a running one's alone.
func TestSocketDirOfAKilledWorkerIsRemovedByTheNext(t *testing.T) {
	if os.Getenv("TAILGATE_SOCKETDIR_CHILD") == "1" {
		dir, _, err := socketDir(slog.New(slog.DiscardHandler))
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(dir)
		time.Sleep(time.Minute) // killed long before
		os.Exit(0)
	}
	t.Setenv("TMPDIR", t.TempDir())

	running, release, err := socketDir(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer release()

	child := exec.Command(os.Args[0], "-test.run=^TestSocketDirOfAKilledWorkerIsRemovedByTheNext$")
	child.Env = append(os.Environ(), "TAILGATE_SOCKETDIR_CHILD=1")
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		child.Process.Kill()
		t.Fatalf("the child said nothing: %v", err)
	}
	killed := strings.TrimSpace(line)
	if !strings.HasPrefix(filepath.Base(killed), socketDirPrefix) {
		child.Process.Kill()
		t.Fatalf("the child said %q, want its socket directory", line)
	}
	if err := child.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	_ = child.Wait()
	if _, err := os.Stat(killed); err != nil {
		t.Fatalf("the killed worker's directory is not there to be swept: %v", err)
	}
	legacy := filepath.Join(os.TempDir(), socketDirPrefix+"legacy") // made before the lock: left alone
	if err := os.Mkdir(legacy, 0o700); err != nil {
		t.Fatal(err)
	}

	var logged strings.Builder
	next, releaseNext, err := socketDir(slog.New(slog.NewTextHandler(&logged, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer releaseNext()
	if _, err := os.Stat(killed); !os.IsNotExist(err) {
		t.Errorf("the killed worker's socket directory %s is still there (%v)", killed, err)
	}
	if !strings.Contains(logged.String(), "a killed worker left") || !strings.Contains(logged.String(), killed) {
		t.Errorf("the sweep was not logged with the directory: %q", logged.String())
	}
	for _, dir := range []string{running, next, legacy} {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("%s is gone: %v", dir, err)
		}
	}
	releaseNext()
	if _, err := os.Stat(next); !os.IsNotExist(err) {
		t.Errorf("release left %s (%v)", next, err)
	}
}
