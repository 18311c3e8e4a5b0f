package gateway

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// DatabaseURLFile is where a gateway started with --database postgres://…
// writes that URL (mode 0600: it may hold a password), so that the admin
// commands given the same --data DIR reach the same database.
const DatabaseURLFile = "database.url"

// gatewayDatabase returns the database a gateway on dir uses: url (recorded
// in dir for the admin commands), or else SQLite's dir/tailgate.db. A dir
// that recorded a PostgreSQL URL is refused without one, so that a gateway
// cannot start on an empty SQLite file while keys and the ledger are in
// PostgreSQL.
func gatewayDatabase(dir, url string) (string, error) {
	path := filepath.Join(dir, DatabaseURLFile)
	if url == "" {
		if _, err := os.Stat(path); err == nil {
			return "", fmt.Errorf("--data %s was used with --database (%s names a PostgreSQL database): give --database again, or delete that file to use SQLite in %s", dir, path, dir)
		}
		return filepath.Join(dir, "tailgate.db"), nil
	}
	if err := os.WriteFile(path, []byte(url+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("--database: record it for the admin commands: %w", err)
	}
	return url, nil
}

// ExistingDatabase returns the database of the gateway deployment in dir:
// the PostgreSQL URL its gateway recorded, or the path of its SQLite file;
// or an error if there is none: a command that reads a deployment must not
// create a fresh one where --data is mistyped, or keys made there would be
// unknown to every gateway and usage would be empty, silently.
func ExistingDatabase(dir string) (string, error) {
	if raw, err := os.ReadFile(filepath.Join(dir, DatabaseURLFile)); err == nil {
		return strings.TrimSpace(string(raw)), nil
	}
	db := filepath.Join(dir, "tailgate.db")
	if fi, err := os.Stat(db); err != nil || !fi.Mode().IsRegular() {
		return "", fmt.Errorf("--data %s holds no database (%s does not exist): give the data directory of the gateway or of `tailgate up`, which creates it on first start, or prepare this one with `tailgate init --data %s`", dir, db, dir)
	}
	return db, nil
}
