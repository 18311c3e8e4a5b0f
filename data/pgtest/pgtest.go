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
// The server itself is [pglocal]'s; this package adds the test's view: one
// server per binary, a database per test, failing or skipping the test.
package pgtest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/tailgate-dev/tailgate/data/pglocal"
)

// SkipEnv is the environment variable that, set to "skip", turns the
// failure of a test that finds no PostgreSQL into a skip.
const SkipEnv = "TAILGATE_TEST_POSTGRES"

// BinDirEnv names a directory holding initdb, pg_ctl and createdb, for a
// PostgreSQL that is not where Debian puts it (/usr/lib/postgresql/N/bin).
const BinDirEnv = pglocal.BinDirEnv

var (
	mu     sync.Mutex
	srv    *pglocal.Server
	srvErr error
	dbSeq  int
)

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
	name := newName()
	url, err := s.CreateDatabase(name)
	if err != nil {
		tb.Fatal(err)
	}
	// A test that failed may have left a connection behind: dropdb cuts it.
	tb.Cleanup(func() { _ = s.DropDatabase(name) })
	return url
}

// Server is a PostgreSQL server of a test's own, which the test may stop
// and start again (to see what a gateway does while its database is down).
type Server struct {
	s  *pglocal.Server
	tb testing.TB
}

// Dedicated starts a server for tb alone, durable (an acknowledged commit
// survives Stop); it is stopped and its cluster deleted when tb ends. It
// fails (or skips) tb as [NewDatabase] does when PostgreSQL cannot be
// started.
func Dedicated(tb testing.TB) *Server {
	tb.Helper()
	s, err := pglocal.Start(true)
	if err != nil {
		if os.Getenv(SkipEnv) == "skip" {
			tb.Skipf("PostgreSQL: %v (skipped: %s=skip)", err, SkipEnv)
		}
		tb.Fatalf("PostgreSQL is needed for this test: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return &Server{s: s, tb: tb}
}

// NewDatabase creates a fresh database on the server and returns its URL.
func (d *Server) NewDatabase() string {
	d.tb.Helper()
	url, err := d.s.CreateDatabase(newName())
	if err != nil {
		d.tb.Fatal(err)
	}
	return url
}

// Stop stops the server at once (connections are cut, as when the database
// host goes away); its data stay for Start.
func (d *Server) Stop() {
	d.tb.Helper()
	if err := d.s.Stop(); err != nil {
		d.tb.Fatal(err)
	}
}

// Start starts the stopped server again, on the same port.
func (d *Server) Start() {
	d.tb.Helper()
	if err := d.s.Restart(); err != nil {
		d.tb.Fatal(err)
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
	_ = srv.Close()
	srv = nil
}

func start() (*pglocal.Server, error) {
	mu.Lock()
	defer mu.Unlock()
	if srv != nil || srvErr != nil {
		return srv, srvErr
	}
	srv, srvErr = pglocal.Start(false)
	return srv, srvErr
}

func newName() string {
	mu.Lock()
	defer mu.Unlock()
	dbSeq++
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("t%d_%s", dbSeq, hex.EncodeToString(b))
}
