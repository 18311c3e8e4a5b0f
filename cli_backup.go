package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/server/gateway"
)

const backupSynopsis = `backup --data DIR [--force] FILE

Writes a consistent copy of DIR's database to FILE while a gateway may be
running on it. FILE may not be inside DIR (the live database, its -wal, -shm
and commit-log files are there). Put it back with 'tailgate restore'`

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
	st, err := openStore(*dir)
	if err != nil {
		return err
	}
	defer st.Close()
	// Before --force is looked at: no flag lets a backup replace the
	// database it copies.
	if err := st.CheckBackupTarget(dst); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if !*force {
		if _, err := os.Lstat(dst); err == nil {
			return fmt.Errorf("backup: %s exists (--force replaces it)", dst)
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("backup: %w", err)
		}
	}
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

const restoreSynopsis = `restore --data DIR [--forget-workers] FILE

Puts FILE, a copy made by 'tailgate backup', in place of DIR/tailgate.db.
Stop the gateway first: restore refuses while one runs on DIR. FILE must be
a tailgate database this binary knows. The database it replaces is kept as
DIR/tailgate.db.replaced-TIME (with its -wal and commit-log files)`

func cmdRestore(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("restore", restoreSynopsis, stderr)
	dir := fs.String("data", "tailgate-data", "data directory whose database (tailgate.db) is replaced")
	forget := fs.Bool("forget-workers", false, "revoke the worker credentials the backup holds: on a new box, or for a second region, whose workers start with empty --data directories (approve their replica ids again: tailgate workers approve)")
	pos, err := parseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] == "" {
		return usageError(fs, stderr, fs.Usage, errors.New("want exactly one FILE"))
	}
	url := filepath.Join(*dir, gateway.DatabaseURLFile)
	if _, err := os.Stat(url); err == nil {
		return fmt.Errorf("restore: --data %s uses PostgreSQL (%s): restore it with pg_restore", *dir, url)
	}
	db := filepath.Join(*dir, "tailgate.db")
	r, err := data.Restore(ctx, db, pos[0])
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "restored %s to %s (schema version %d)\n", pos[0], db, r.Version)
	if len(r.Replaced) == 0 {
		fmt.Fprintf(stdout, "%s held no database: nothing was replaced\n", *dir)
	}
	for i, f := range r.Replaced {
		if i == 0 {
			fmt.Fprintf(stdout, "the database it replaced is kept as %s\n", f)
		} else {
			fmt.Fprintf(stdout, "moved with it: %s\n", f)
		}
	}
	return restoredWorkers(ctx, *dir, *forget, stdout)
}

// restoredWorkers says which worker credentials the restored database
// holds, and with forget revokes them: a replica id belongs to the worker
// holding its credential, and on a new box that worker is not there.
func restoredWorkers(ctx context.Context, dir string, forget bool, stdout io.Writer) error {
	st, err := openStore(dir)
	if err != nil {
		return err
	}
	defer st.Close()
	var active []data.Worker
	if forget {
		if active, err = st.ForgetWorkers(ctx); err != nil {
			return err
		}
	} else {
		ws, err := st.Workers(ctx)
		if err != nil {
			return err
		}
		for _, w := range ws {
			if !w.Revoked() {
				active = append(active, w)
			}
		}
	}
	if len(active) == 0 {
		return nil
	}
	ids := make([]string, len(active))
	for i, w := range active {
		ids[i] = w.ReplicaID + " (" + w.ID + ")"
	}
	if forget {
		fmt.Fprintf(stdout, "forgot %d worker credential(s) of the backup's box, now revoked: %s\n", len(active), strings.Join(ids, ", "))
		fmt.Fprintf(stdout, "a worker joins again once its replica id is approved (tailgate workers approve --data %s ID --code CODE, the code the worker prints while it waits or tailgate workers code --worker-data ITS_DIR prints) or invited (tailgate workers invite); tailgate up's own workers are approved when it starts\n", dir)
		return nil
	}
	fmt.Fprintf(stdout, "the backup holds %d active worker credential(s): %s\n", len(active), strings.Join(ids, ", "))
	fmt.Fprintf(stdout, "workers that kept their --data directories reconnect with them; tailgate up adopts its own worker-N ids; "+
		"on a new box whose workers start fresh, restore with --forget-workers (or tailgate workers revoke --data %s WORKER)\n", dir)
	return nil
}
