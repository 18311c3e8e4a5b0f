// Package pgtest runs a throwaway PostgreSQL server for tests: Debian's
// postgresql binaries, a cluster made by initdb in a temporary directory,
// listening on 127.0.0.1 only (on a free port) and on a unix socket in that
// directory, with trust authentication for the test user. One server is
// started per test binary, on first use, and each test gets a fresh database
// on it; [Stop] (from TestMain) stops the server and deletes the cluster.
//
// A test that needs PostgreSQL fails when it cannot be found or started, so
// that CI cannot pass without it; a developer without PostgreSQL may opt out
// with TAILGATE_TEST_POSTGRES=skip, which skips those tests instead.
//
// It imports nothing of the project: it hands out connection URLs.
package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// SkipEnv is the environment variable that, set to "skip", turns the
// failure of a test that finds no PostgreSQL into a skip.
const SkipEnv = "TAILGATE_TEST_POSTGRES"

// BinDirEnv names a directory holding initdb, pg_ctl and createdb, for a
// PostgreSQL that is not where Debian puts it (/usr/lib/postgresql/N/bin).
const BinDirEnv = "TAILGATE_PG_BINDIR"

const superuser = "tailgate"

var (
	mu     sync.Mutex
	srv    *server
	srvErr error
	dbSeq  int
)

type server struct {
	bin  string // directory of the binaries
	dir  string // temporary directory: data/ and the socket
	port int
	cred *syscall.Credential // the user the server runs as; nil: this one
	// durable: commits are on disk when acknowledged (synchronous_commit),
	// for a server a test stops with -m immediate.
	durable bool
}

// NewDatabase creates a fresh, empty database on the test server (starting
// the server on first use) and returns its URL. The database is dropped
// when tb ends.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	s, err := start()
	if err != nil {
		if os.Getenv(SkipEnv) == "skip" {
			tb.Skipf("PostgreSQL: %v (skipped: %s=skip)", err, SkipEnv)
		}
		tb.Fatalf("PostgreSQL is needed for this test: %v\n"+
			"Install it (Debian: apt-get install -y postgresql; scripts/test.sh does) or set %s=skip to skip these tests locally.", err, SkipEnv)
	}
	mu.Lock()
	dbSeq++
	name := fmt.Sprintf("t%d_%s", dbSeq, randHex(4))
	mu.Unlock()
	if out, err := s.run("createdb", "-h", "127.0.0.1", "-p", strconv.Itoa(s.port), "-U", superuser, name); err != nil {
		tb.Fatalf("createdb %s: %v\n%s", name, err, out)
	}
	tb.Cleanup(func() {
		// --force: a test that failed may have left a connection behind.
		_, _ = s.run("dropdb", "--force", "-h", "127.0.0.1", "-p", strconv.Itoa(s.port), "-U", superuser, name)
	})
	return s.url(name)
}

// Server is a PostgreSQL server of a test's own, which the test may stop
// and start again (to see what a gateway does while its database is down).
type Server struct {
	s  *server
	tb testing.TB
}

// Dedicated starts a server for tb alone; it is stopped and its cluster
// deleted when tb ends. It fails (or skips) tb as [NewDatabase] does when
// PostgreSQL cannot be started.
func Dedicated(tb testing.TB) *Server {
	tb.Helper()
	s, err := startServer(true)
	if err != nil {
		if os.Getenv(SkipEnv) == "skip" {
			tb.Skipf("PostgreSQL: %v (skipped: %s=skip)", err, SkipEnv)
		}
		tb.Fatalf("PostgreSQL is needed for this test: %v", err)
	}
	tb.Cleanup(func() {
		_, _ = s.run("pg_ctl", "stop", "-D", filepath.Join(s.dir, "data"), "-m", "immediate", "-w", "-t", "30")
		_ = os.RemoveAll(s.dir)
	})
	return &Server{s: s, tb: tb}
}

// NewDatabase creates a fresh database on the server and returns its URL.
func (d *Server) NewDatabase() string {
	d.tb.Helper()
	mu.Lock()
	dbSeq++
	name := fmt.Sprintf("t%d_%s", dbSeq, randHex(4))
	mu.Unlock()
	if out, err := d.s.run("createdb", "-h", "127.0.0.1", "-p", strconv.Itoa(d.s.port), "-U", superuser, name); err != nil {
		d.tb.Fatalf("createdb %s: %v\n%s", name, err, out)
	}
	return d.s.url(name)
}

// Stop stops the server at once (connections are cut, as when the database
// host goes away); its data stay for Start.
func (d *Server) Stop() {
	d.tb.Helper()
	if out, err := d.s.run("pg_ctl", "stop", "-D", filepath.Join(d.s.dir, "data"), "-m", "immediate", "-w", "-t", "30"); err != nil {
		d.tb.Fatalf("pg_ctl stop: %v\n%s", err, out)
	}
}

// Start starts the stopped server again, on the same port.
func (d *Server) Start() {
	d.tb.Helper()
	if out, err := d.s.pgStart(); err != nil {
		log, _ := os.ReadFile(filepath.Join(d.s.dir, "server.log"))
		d.tb.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
}

// Stop stops the server, if one was started, and deletes its cluster. Call
// it from TestMain after m.Run.
func Stop() {
	mu.Lock()
	defer mu.Unlock()
	if srv == nil {
		return
	}
	_, _ = srv.run("pg_ctl", "stop", "-D", filepath.Join(srv.dir, "data"), "-m", "immediate", "-w", "-t", "30")
	_ = os.RemoveAll(srv.dir)
	srv = nil
}

func (s *server) url(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", superuser, s.port, db)
}

func start() (*server, error) {
	mu.Lock()
	defer mu.Unlock()
	if srv != nil || srvErr != nil {
		return srv, srvErr
	}
	srv, srvErr = startServer(false)
	return srv, srvErr
}

func startServer(durable bool) (_ *server, err error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	s := &server{bin: bin, durable: durable}
	// initdb refuses to run as root: the cluster then belongs to the
	// postgres user (Debian's package creates it) or else nobody.
	if os.Geteuid() == 0 {
		if s.cred, err = serverUser(); err != nil {
			return nil, err
		}
	}
	if s.dir, err = os.MkdirTemp("", "tailgate-pg-*"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(s.dir)
		}
	}()
	if s.cred != nil {
		if err := os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(s.dir, "data")
	if out, err := s.run("initdb", "-D", data, "-U", superuser, "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"); err != nil {
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	// The port is free when asked and may be taken by the time the server
	// binds it; another one is tried then.
	for attempt := 0; ; attempt++ {
		if s.port, err = freePort(); err != nil {
			return nil, err
		}
		out, err := s.pgStart()
		if err == nil {
			return s, nil
		}
		if attempt == 2 {
			log, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
			return nil, fmt.Errorf("pg_ctl start: %v\n%s\n%s", err, out, log)
		}
	}
}

// pgStart starts the server of the cluster on s.port.
func (s *server) pgStart() ([]byte, error) {
	// A stopped server's data stay in the OS's cache, so fsync is not
	// needed; an acknowledged commit must have left the server's memory
	// before an immediate stop (a crash) only where the test stops it.
	sync := "off"
	if s.durable {
		sync = "on"
	}
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -c port=%d -c unix_socket_directories=%s "+
		"-c fsync=off -c synchronous_commit=%s -c full_page_writes=off -c max_connections=300", s.port, s.dir, sync)
	return s.run("pg_ctl", "start", "-D", filepath.Join(s.dir, "data"), "-l", filepath.Join(s.dir, "server.log"), "-o", opts, "-w", "-t", "60")
}

// run runs one of the PostgreSQL binaries as the server's user, bounded in
// time.
func (s *server) run(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGCONNECT_TIMEOUT=10")
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// binDir finds initdb: $TAILGATE_PG_BINDIR, else the newest
// /usr/lib/postgresql/N/bin, else the PATH.
func binDir() (string, error) {
	if d := os.Getenv(BinDirEnv); d != "" {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err != nil {
			return "", fmt.Errorf("%s=%s: %w", BinDirEnv, d, err)
		}
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("no initdb in /usr/lib/postgresql/*/bin, in $" + BinDirEnv + " or on the PATH")
}

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func serverUser() (*syscall.Credential, error) {
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err1 == nil && err2 == nil {
			return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
		}
	}
	return nil, errors.New("running as root, and there is neither a postgres nor a nobody user to run PostgreSQL as (initdb refuses root)")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
