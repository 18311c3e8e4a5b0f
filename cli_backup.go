package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

const backupSynopsis = `backup --data DIR [--force] FILE

Writes a consistent copy of DIR's database to FILE while a gateway may be
running on it. To restore: stop the gateway, delete DIR/tailgate.db-wal and
DIR/tailgate.db-shm if present, copy FILE to DIR/tailgate.db, start again`

func cmdBackup(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("backup", backupSynopsis, stderr)
	var (
		dir   = fs.String("data", "tailgate-data", "data directory holding the database (tailgate.db)")
		force = fs.Bool("force", false, "replace FILE if it exists")
	)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	// Flags may also follow FILE: tailgate backup FILE --data DIR.
	rest := fs.Args()
	if len(rest) > 1 {
		if err := parseFlags(fs, rest[1:]); err != nil {
			return err
		}
		rest = append([]string{rest[0]}, fs.Args()...)
	}
	if len(rest) != 1 || rest[0] == "" {
		fmt.Fprintln(stderr, "tailgate backup: want exactly one FILE")
		fs.Usage()
		return errUsage
	}
	dst := rest[0]

	db := filepath.Join(*dir, "tailgate.db")
	if fi, err := os.Stat(db); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("backup: no database in %s (want %s)", *dir, db)
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
