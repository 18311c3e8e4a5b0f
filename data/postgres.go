package data

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// engine is the database a Store runs on.
type engine int

const (
	engineSQLite engine = iota
	enginePostgres
)

func (e engine) String() string {
	if e == enginePostgres {
		return "PostgreSQL"
	}
	return "SQLite"
}

// IsPostgres reports whether location names a PostgreSQL database
// (a postgres:// or postgresql:// URL) rather than a SQLite file.
func IsPostgres(location string) bool {
	return strings.HasPrefix(location, "postgres://") || strings.HasPrefix(location, "postgresql://")
}

// Redact returns location safe to log and show: a URL without its
// password, a file path as it is.
func Redact(location string) string {
	if !strings.Contains(location, "://") {
		return location
	}
	u, err := url.Parse(location)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// openPostgres opens the PostgreSQL database at the URL dsn. The schema is
// the same as SQLite's (see migrations/postgres), and so are the queries:
// they are written with SQLite's '?' placeholders, which the connections
// below rewrite to PostgreSQL's $n, so one text serves both engines.
//
// Like SQLite's, the write pool has one connection, so one process's writes
// are serialized as they are on SQLite; reads use a pool of their own whose
// sessions are read-only (a write through it fails loudly).
func openPostgres(dsn string) (_ *Store, err error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		// pgx's message may quote the URL, password included.
		return nil, fmt.Errorf("parse %s: invalid PostgreSQL URL", Redact(dsn))
	}
	s := &Store{path: Redact(dsn), engine: enginePostgres, instance: newInstanceID()}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	s.write = sql.OpenDB(rebindConnector{stdlib.GetConnector(*cfg)})
	s.write.SetMaxOpenConns(1)
	s.write.SetMaxIdleConns(1)
	if err := s.write.Ping(); err != nil {
		return nil, fmt.Errorf("connect to %s: %w", Redact(dsn), err)
	}
	if err := migrate(context.Background(), s.write, enginePostgres); err != nil {
		return nil, err
	}
	if err := s.prepareLedger(); err != nil {
		return nil, err
	}
	rcfg := cfg.Copy()
	rcfg.RuntimeParams["default_transaction_read_only"] = "on"
	s.read = sql.OpenDB(rebindConnector{stdlib.GetConnector(*rcfg)})
	s.read.SetMaxOpenConns(readConns)
	s.read.SetMaxIdleConns(readConns)
	if err := s.read.Ping(); err != nil {
		return nil, err
	}
	s.book = sql.OpenDB(rebindConnector{stdlib.GetConnector(*cfg)})
	s.book.SetMaxOpenConns(bookConns)
	s.book.SetMaxIdleConns(bookConns)
	return s, nil
}

// migrateLockID is the PostgreSQL advisory lock that serializes migrations
// of gateways starting at once (SQLite's write lock does it there).
const migrateLockID = 0x7461696c67617465 // "tailgate"

// rebind rewrites SQLite's '?' placeholders as PostgreSQL's $1, $2, …,
// leaving quoted strings, quoted identifiers and comments alone.
func rebind(q string) string {
	if !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 16)
	n := 0
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case c == '\'' || c == '"':
			j := strings.IndexByte(q[i+1:], c)
			if j < 0 {
				b.WriteString(q[i:])
				return b.String()
			}
			b.WriteString(q[i : i+j+2])
			i += j + 1
		case c == '-' && strings.HasPrefix(q[i:], "--"):
			j := strings.IndexByte(q[i:], '\n')
			if j < 0 {
				b.WriteString(q[i:])
				return b.String()
			}
			b.WriteString(q[i : i+j+1])
			i += j
		case c == '/' && strings.HasPrefix(q[i:], "/*"):
			j := strings.Index(q[i+2:], "*/")
			if j < 0 {
				b.WriteString(q[i:])
				return b.String()
			}
			b.WriteString(q[i : i+j+4])
			i += j + 3
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// rebindConnector hands out pgx connections whose query texts are rebound.
type rebindConnector struct{ driver.Connector }

func (c rebindConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	pc, ok := conn.(*stdlib.Conn)
	if !ok {
		conn.Close()
		return nil, fmt.Errorf("pgx connector returned %T", conn)
	}
	return rebindConn{pc}, nil
}

// rebindConn is a pgx connection that rewrites every query text it is
// given with [rebind]; everything else is pgx's.
type rebindConn struct{ *stdlib.Conn }

func (c rebindConn) Prepare(q string) (driver.Stmt, error) { return c.Conn.Prepare(rebind(q)) }

func (c rebindConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	return c.Conn.PrepareContext(ctx, rebind(q))
}

func (c rebindConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.ExecContext(ctx, rebind(q), args)
}

func (c rebindConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.QueryContext(ctx, rebind(q), args)
}

// pgCode names PostgreSQL's SQLSTATE in err ("SQLSTATE 53100"), or returns
// "" if err is not a PostgreSQL error.
func pgCode(err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return ""
	}
	return "SQLSTATE " + pe.Code
}

// maxConflictRetries is how many times in a row a ledger transaction that
// lost a lock race to another gateway's is run again at once.
const maxConflictRetries = 3

// conflict reports whether err is PostgreSQL aborting a transaction that
// lost to a concurrent one (a deadlock, a serialization failure): running
// it again is expected to succeed.
func conflict(err error) bool {
	switch pgCode(err) {
	case "SQLSTATE 40P01", "SQLSTATE 40001":
		return true
	}
	return false
}

// ErrNotSQLite is returned by operations that exist only for a SQLite file.
var ErrNotSQLite = errors.New("not a SQLite database")
