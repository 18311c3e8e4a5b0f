package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"tailgate/data"
)

const workersUsage = `Usage:
  tailgate workers list   --data DIR [--json]
  tailgate workers revoke --data DIR WORKER   (WORKER: worker id, or the replica id it registered)

Run 'tailgate workers SUBCOMMAND -h' for its flags.
`

func cmdWorkers(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return dispatch(ctx, "workers", workersUsage, []subcommand{
		{"list", cmdWorkersList},
		{"revoke", cmdWorkersRevoke},
	}, args, stdout, stderr)
}

// workerJSON is a worker credential as `workers list --json` prints it:
// never its hash.
type workerJSON struct {
	ID        string     `json:"id"`
	ReplicaID string     `json:"replica_id"`
	Address   string     `json:"address"`
	Peer      string     `json:"peer,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

func cmdWorkersList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("workers list", "workers list --data DIR [--json]", stderr)
	var (
		dir    = fs.String("data", "tailgate-data", "data directory")
		asJSON = fs.Bool("json", false, "print JSON")
	)
	st, _, err := openCommand(fs, stderr, args, dir, "")
	if err != nil {
		return err
	}
	defer st.Close()
	ws, err := st.Workers(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		out := make([]workerJSON, 0, len(ws))
		for _, w := range ws {
			j := workerJSON{ID: w.ID, ReplicaID: w.ReplicaID, Address: w.Address, Peer: w.Peer, CreatedAt: w.CreatedAt}
			if w.Revoked() {
				j.RevokedAt = &w.RevokedAt
			}
			out = append(out, j)
		}
		return writeJSON(stdout, out)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tREPLICA\tADDRESS\tPEER\tCREATED\tSTATUS")
	for _, w := range ws {
		status, peer := "active", w.Peer
		if w.Revoked() {
			status = "revoked"
		}
		if peer == "" {
			peer = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", w.ID, w.ReplicaID, w.Address, peer, w.CreatedAt.Format(time.RFC3339), status)
	}
	return tw.Flush()
}

func cmdWorkersRevoke(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("workers revoke", "workers revoke --data DIR WORKER   (WORKER: worker id, or the replica id it registered)", stderr)
	dir := fs.String("data", "tailgate-data", "data directory")
	st, ref, err := openCommand(fs, stderr, args, dir, "WORKER to revoke")
	if err != nil {
		return err
	}
	defer st.Close()
	w, err := st.RevokeWorker(ctx, ref)
	switch {
	case errors.Is(err, data.ErrNotFound):
		return errors.New("no worker has that id, nor an active one that replica id (see `tailgate workers list`)")
	case err != nil:
		return err
	}
	fmt.Fprintf(stdout, "revoked %s (replica %s at %s); a running gateway refuses its next heartbeat and drops it from routing when its lease ends (DELETE /admin/v1/workers/%s drops it at once)\n",
		w.ID, w.ReplicaID, w.Address, w.ID)
	return nil
}
