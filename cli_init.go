package main

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/tailgate-dev/tailgate/server/gateway"
)

// cmdInit prepares a data directory as a gateway's first start would, so a
// provisioning script can create keys (and copy the cluster token to the
// workers) before any gateway runs. The admin commands do not do this
// themselves: a mistyped --data must stay an error there, not a new
// deployment no gateway knows.
func cmdInit(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("init", "init --data DIR [--database postgres://…]", stderr)
	var (
		dir      = fs.String("data", "tailgate-data", "data directory to prepare (created if missing)")
		database = fs.String("database", "", "PostgreSQL URL instead of SQLite in DIR (as the gateway's --database)")
	)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	p, err := gateway.Prepare(*dir, *database)
	if err != nil {
		return err
	}
	state := func(path string) string {
		if slices.Contains(p.Created, path) {
			return "created"
		}
		return "kept"
	}
	db := p.Database
	if *database != "" {
		db = "PostgreSQL (URL in " + *dir + "/" + gateway.DatabaseURLFile + ")"
	}
	fmt.Fprintf(stdout, "tailgate init: %s is ready for `tailgate gateway --data %s` (or up)\n", *dir, *dir)
	fmt.Fprintf(stdout, "  admin token    %s (%s)\n", p.AdminToken, state(p.AdminToken))
	fmt.Fprintf(stdout, "  cluster token  %s (%s)\n", p.ClusterToken, state(p.ClusterToken))
	fmt.Fprintf(stdout, "  database       %s (%s, migrated)\n", db, state(p.Database))
	return nil
}
