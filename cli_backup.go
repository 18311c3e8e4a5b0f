package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"tailgate/server/gateway"
)

const backupSynopsis = `backup --data DIR [--force] FILE

Writes a consistent copy of DIR's database to FILE while a gateway may be
running on it. To restore: stop the gateway, delete DIR/tailgate.db-wal,
DIR/tailgate.db-shm and DIR/tailgate.db-commits-* if present, copy FILE to
DIR/tailgate.db, start again`

func cmdBackup(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("backup", backupSynopsis, stderr)
	var (
		dir   = fs.String("data", "tailgate-data", "data directory holding the database (tailgate.db)")
		force = fs.Bool("force", false, "replace FILE if it exists")
	)
	// Flags may also follow FILE: tailgate backup FILE --data DIR.
	pos, err := parseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] == "" {
		return usageError(fs, stderr, fs.Usage, errors.New("want exactly one FILE"))
	}
	dst := pos[0]
	if _, err := gateway.ExistingDatabase(*dir); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if !*force {
		if _, err := os.Lstat(dst); err == nil {
			return fmt.Errorf("backup: %s exists (--force replaces it)", dst)
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("backup: %w", err)
		}
	}
	st, err := openStore(*dir)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Backup(ctx, dst); err != nil {
		return err
	}
	fi, err := os.Stat(dst)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	abs, err := filepath.Abs(dst)
	if err != nil {
		abs = dst
	}
	fmt.Fprintf(stdout, "%s\t%d bytes\n", abs, fi.Size())
	return nil
}
