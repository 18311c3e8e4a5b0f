// Package pglocal runs a throwaway PostgreSQL server on this machine:
// Debian's postgresql binaries, a cluster made by initdb in a new temporary
// directory, listening on 127.0.0.1 only (on a free port) and on a unix
// socket in that directory, with trust authentication for one superuser.
// Tests (through data/pgtest) and `tailgate bench --scenario databases` use
// it; it is no way to run a production database.
//
// It imports nothing of the project and knows no SQL: it hands out
// connection URLs.
package pglocal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// BinDirEnv names a directory holding initdb, pg_ctl and createdb, for a
// PostgreSQL that is not where Debian puts it (/usr/lib/postgresql/N/bin).
const BinDirEnv = "TAILGATE_PG_BINDIR"

// ErrNotInstalled is returned by [Start] when no PostgreSQL binaries are
// found.
var ErrNotInstalled = errors.New("PostgreSQL is not installed: no initdb in /usr/lib/postgresql/*/bin, in $" + BinDirEnv +
	" or on the PATH (Debian, Ubuntu: apt-get install -y postgresql)")

const superuser = "tailgate"

// Server is a running throwaway PostgreSQL server.
type Server struct {
	bin  string // directory of the binaries
	dir  string // temporary directory: data/, server.log and the socket
	port int
	cred *syscall.Credential // the user the server runs as; nil: this one
	// durable: commits are on disk when acknowledged (synchronous_commit).
	durable bool
}

// Start makes a cluster in a new temporary directory and starts a server on
// it. Durable makes an acknowledged commit survive an immediate stop (a
// crash); without it commits are acknowledged before they leave the
// server's memory, which is faster. Close stops it and deletes the cluster.
func Start(durable bool) (_ *Server, err error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, durable: durable}
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
			return nil, fmt.Errorf("pg_ctl start: %v\n%s\n%s", err, out, s.log())
		}
	}
}

// Version is the server's major version, from the directory of its
// binaries (0 when that does not tell).
func (s *Server) Version() int { return version(s.bin) }

// URL is the connection URL of database db on the server.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", superuser, s.port, db)
}

// CreateDatabase creates an empty database and returns its URL.
func (s *Server) CreateDatabase(name string) (string, error) {
	if out, err := s.run("createdb", "-h", "127.0.0.1", "-p", strconv.Itoa(s.port), "-U", superuser, name); err != nil {
		return "", fmt.Errorf("createdb %s: %v\n%s", name, err, out)
	}
	return s.URL(name), nil
}

// DropDatabase drops a database, cutting the connections left to it.
func (s *Server) DropDatabase(name string) error {
	if out, err := s.run("dropdb", "--force", "-h", "127.0.0.1", "-p", strconv.Itoa(s.port), "-U", superuser, name); err != nil {
		return fmt.Errorf("dropdb %s: %v\n%s", name, err, out)
	}
	return nil
}

// Stop stops the server at once (connections are cut, as when the database
// host goes away); its data stay for Restart.
func (s *Server) Stop() error {
	if out, err := s.run("pg_ctl", "stop", "-D", filepath.Join(s.dir, "data"), "-m", "immediate", "-w", "-t", "30"); err != nil {
		return fmt.Errorf("pg_ctl stop: %v\n%s", err, out)
	}
	return nil
}

// Restart starts the stopped server again, on the same port.
func (s *Server) Restart() error {
	if out, err := s.pgStart(); err != nil {
		return fmt.Errorf("pg_ctl start: %v\n%s\n%s", err, out, s.log())
	}
	return nil
}

// Close stops the server and deletes its cluster.
func (s *Server) Close() error {
	_, _ = s.run("pg_ctl", "stop", "-D", filepath.Join(s.dir, "data"), "-m", "immediate", "-w", "-t", "30")
	return os.RemoveAll(s.dir)
}

func (s *Server) log() string {
	raw, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	return strings.TrimSpace(string(raw))
}

// pgStart starts the server of the cluster on s.port.
func (s *Server) pgStart() ([]byte, error) {
	// A stopped server's data stay in the OS's cache, so fsync is not
	// needed; an acknowledged commit must have left the server's memory
	// before an immediate stop (a crash) only where durable asks for it.
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
func (s *Server) run(name string, args ...string) ([]byte, error) {
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

// BinDir finds initdb: $TAILGATE_PG_BINDIR, else the newest
// /usr/lib/postgresql/N/bin, else the PATH. It returns [ErrNotInstalled]
// when there is none.
func BinDir() (string, error) {
	if d := os.Getenv(BinDirEnv); d != "" {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err != nil {
			return "", fmt.Errorf("%w (%s=%s: %v)", ErrNotInstalled, BinDirEnv, d, err)
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
	return "", ErrNotInstalled
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
