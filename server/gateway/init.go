package gateway

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tailgate-dev/tailgate/data"
)

// Prepared says what [Prepare] found and made in a data directory.
type Prepared struct {
	AdminToken, ClusterToken string // the token files' paths
	Database                 string // the SQLite file, or the PostgreSQL URL as given
	Created                  []string
}

// Prepare makes dir what a gateway's first start would make of it, and
// nothing more: the directory (mode 0700), admin.token and cluster.token
// (mode 0600, kept when they are there and sound) and the database with
// every migration applied (SQLite's dir/tailgate.db, or database, a
// PostgreSQL URL, recorded in dir as the gateway records it). Run again,
// it changes nothing: provisioning scripts may call it on every run.
func Prepare(dir, database string) (Prepared, error) {
	p := Prepared{AdminToken: filepath.Join(dir, "admin.token"), ClusterToken: filepath.Join(dir, "cluster.token")}
	missing := func(path string) bool {
		_, err := os.Stat(path)
		return errors.Is(err, os.ErrNotExist)
	}
	fresh := map[string]bool{dir: missing(dir), p.AdminToken: missing(p.AdminToken), p.ClusterToken: missing(p.ClusterToken)}
	if _, _, err := ensureTokens(dir); err != nil {
		return p, err
	}
	if _, err := ensureSecretFile(filepath.Join(dir, "edge.token"), "tge-"); err != nil { // copies of dir share it: one token for every region
		return p, err
	}
	db, err := gatewayDatabase(dir, database)
	if err != nil {
		return p, err
	}
	p.Database = db
	fresh[db] = !data.IsPostgres(db) && missing(db)
	st, err := data.Open(db)
	if err != nil {
		return p, err
	}
	if err := st.Close(); err != nil {
		return p, fmt.Errorf("close store: %w", err)
	}
	for _, path := range []string{dir, p.AdminToken, p.ClusterToken, db} {
		if fresh[path] {
			p.Created = append(p.Created, path)
		}
	}
	return p, nil
}
