package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/serving"
)

func cmpOr(s, or string) string {
	if s == "" {
		return or
	}
	return s
}

// cmdWorkers is `tailgate workers` and its verbs.
func cmdWorkers() command {
	return command{name: "workers", short: "worker credentials: list, invite, approve, revoke, code", notes: workersNotes, subs: []command{
		{name: "list", run: cmdWorkersList, synopsis: "--data DIR [--json]"},
		{name: "invite", run: cmdWorkersInvite, synopsis: "--data DIR --replica-id ID [--expires 1h]", short: "prints a one-time join token for the worker ID"},
		{name: "approve", run: cmdWorkersApprove, synopsis: "--data DIR ID --code CODE", short: "admits the worker under ID whose approval code is CODE"},
		{name: "revoke", run: cmdWorkersRevoke, synopsis: "--data DIR WORKER", short: "WORKER: worker id, or the replica id it registered"},
		{name: "code", run: cmdWorkersCode, synopsis: "--worker-data DIR", short: "the approval code of the worker whose --data is DIR"},
	}}
}

const workersNotes = "A new worker joins with a join token (invite) or an approval of the code it prints while it waits.\n"

// workerJSON is a worker credential as `workers list --json` prints it:
// never its hash.
type workerJSON struct {
	ID        string     `json:"id,omitempty"` // "" for a pending replica id
	ReplicaID string     `json:"replica_id"`
	Address   string     `json:"address"`
	Peer      string     `json:"peer,omitempty"`
	Status    string     `json:"status"` // active, revoked or pending
	CreatedAt *time.Time `json:"created_at,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	// RequestedAt is when a pending replica id last asked to register.
	RequestedAt *time.Time `json:"requested_at,omitempty"`
	// Code and Source are a pending id's last request's approval code and
	// source address.
	Code   string `json:"code,omitempty"`
	Source string `json:"source,omitempty"`
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
	pending, err := st.PendingWorkers(ctx)
	if err != nil {
		return err
	}
	out := make([]workerJSON, 0, len(ws)+len(pending))
	for _, w := range ws {
		j := workerJSON{ID: w.ID, ReplicaID: w.ReplicaID, Address: w.Address, Peer: w.Peer, Status: "active", CreatedAt: &w.CreatedAt}
		if w.Revoked() {
			j.Status, j.RevokedAt = "revoked", &w.RevokedAt
		}
		out = append(out, j)
	}
	for _, a := range pending {
		out = append(out, workerJSON{ReplicaID: a.ReplicaID, Address: a.Address, Peer: a.Peer, Status: data.AdmissionPending, RequestedAt: &a.RequestedAt,
			Code: a.AskedCode, Source: a.Source})
	}
	if *asJSON {
		return writeJSON(stdout, out)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tREPLICA\tADDRESS\tPEER\tCREATED\tSTATUS")
	for _, j := range out {
		id, peer, when := j.ID, j.Peer, "-"
		if id == "" {
			id = "-"
		}
		if peer == "" {
			peer = "-"
		}
		if j.CreatedAt != nil {
			when = j.CreatedAt.Format(time.RFC3339)
		}
		status := j.Status
		if status == data.AdmissionPending {
			status = "pending (asked " + j.RequestedAt.Format(time.RFC3339) + " from " + cmpOr(j.Source, "?") + " with code " + cmpOr(j.Code, "none") +
				"; tailgate workers approve " + j.ReplicaID + " --code CODE-THE-WORKER-PRINTS)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", id, j.ReplicaID, j.Address, peer, when, status)
	}
	return tw.Flush()
}

func cmdWorkersInvite(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("workers invite", "workers invite --data DIR --replica-id ID [--expires 1h]", stderr)
	var (
		dir     = fs.String("data", "tailgate-data", "data directory")
		replica = fs.String("replica-id", "", "the replica id the token admits (the worker's --replica-id); required")
		expires = fs.Duration("expires", time.Hour, "how long the token may be used (once)")
	)
	st, _, err := openCommand(fs, stderr, args, dir, "")
	if err != nil {
		return err
	}
	defer st.Close()
	if *replica == "" {
		return errors.New("--replica-id is required: the token admits only the worker registering under that id")
	}
	if err := data.CheckReplicaID(*replica); err != nil {
		return fmt.Errorf("--replica-id %q: %w", *replica, err)
	}
	if *expires <= 0 {
		return fmt.Errorf("--expires %s: want a positive duration, e.g. 1h", *expires)
	}
	if w, err := st.ActiveWorkerFor(ctx, *replica); err == nil {
		return fmt.Errorf("replica id %s belongs to worker %s; revoke it first if a new box should take it: tailgate workers revoke --data %s %s", *replica, w.ID, *dir, w.ID)
	} else if !errors.Is(err, data.ErrNotFound) {
		return err
	}
	inv, token, err := st.CreateInvite(ctx, *replica, *expires)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "invite %s: admits one worker registering as replica %s until %s; start it with --replica-id %s --join-token-file FILE (FILE holding the token below) or TAILGATE_JOIN_TOKEN\n",
		inv.ID, inv.ReplicaID, inv.ExpiresAt.Format(time.RFC3339), inv.ReplicaID)
	fmt.Fprintln(stdout, token)
	return nil
}

func cmdWorkersApprove(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("workers approve", "workers approve --data DIR ID --code CODE   (ID: a pending or revoked replica id, or a revoked worker's id)", stderr)
	dir := fs.String("data", "tailgate-data", "data directory")
	code := fs.String("code", "", "the approval code the worker prints while it waits (XXXX-XXXX-XXXX); required: the approval admits that worker only")
	st, ref, err := openCommand(fs, stderr, args, dir, "replica ID to approve")
	if err != nil {
		return err
	}
	defer st.Close()
	if *code == "" {
		return errors.New("--code is required: the waiting worker prints its approval code (`tailgate workers list` shows the code each pending id asked with; check it against the worker's own log)")
	}
	before, after, err := st.ApproveWorker(ctx, ref, serving.NormalizeApprovalCode(*code))
	if err != nil {
		return err
	}
	switch before.State {
	case data.AdmissionPending:
		fmt.Fprintf(stdout, "approved replica %s for the worker with code %s (the last to ask did from %s with code %s); it registers at its next heartbeat\n",
			after.ReplicaID, after.ApprovedCode, before.Address, cmpOr(before.AskedCode, "none"))
	case data.AdmissionRevoked:
		fmt.Fprintf(stdout, "approved replica %s again (it was revoked); its worker registers at its next heartbeat\n", after.ReplicaID)
	case data.AdmissionApproved:
		fmt.Fprintf(stdout, "replica %s was approved already\n", after.ReplicaID)
	default:
		fmt.Fprintf(stdout, "approved replica %s for the worker with code %s; no worker has asked under that id yet\n",
			after.ReplicaID, after.ApprovedCode)
	}
	return nil
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
	fmt.Fprintf(stdout, "revoked %s (replica %s at %s); a running gateway refuses its next heartbeat and drops it from routing when its lease ends (DELETE /admin/v1/workers/%s drops it at once); replica id %s stays out until `tailgate workers approve %s` or an invite\n",
		w.ID, w.ReplicaID, w.Address, w.ID, w.ReplicaID, w.ReplicaID)
	return nil
}

func cmdWorkersCode(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("workers code", "workers code --worker-data DIR", stderr)
	dir := fs.String("worker-data", "", "the worker's --data directory (its key is DIR/worker.key, made if missing); required")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("--worker-data is required: the worker's --data directory, where its key is kept")
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return fmt.Errorf("--worker-data: %w", err)
	}
	key, err := serving.LoadWorkerKey(filepath.Join(*dir, "worker.key"))
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, serving.ApprovalCode(key))
	return nil
}
