package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"tailgate/data"
	"tailgate/policy"
	"tailgate/server/gateway"
)

const tenantsUsage = `Usage:
  tailgate tenants list --data DIR [--json]
  tailgate tenants show --data DIR NAME [--json]
  tailgate tenants set  --data DIR NAME [--budget-tokens N] [--budget AMOUNT]

Budgets are totals (0: unlimited); in-flight reservations: GET /admin/v1/tenants.
Run 'tailgate tenants SUBCOMMAND -h' for its flags.
`

// reservedNote says why the CLI shows no reserved amounts.
const reservedNote = "note: reserved (in-flight) amounts are known only to a running gateway: GET /admin/v1/tenants on its admin listener shows them"

func cmdTenants(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return dispatch(ctx, "tenants", tenantsUsage, []subcommand{
		{"list", cmdTenantsList},
		{"show", cmdTenantsShow},
		{"set", cmdTenantsSet},
	}, args, stdout, stderr)
}

// tenantViews reads the tenants (all, or the one named) with what the
// ledger says they spent; reserved is unknown here.
func tenantViews(ctx context.Context, st *data.Store, name string) ([]gateway.TenantView, error) {
	var ts []data.Tenant
	if name == "" {
		var err error
		if ts, err = st.Tenants(ctx); err != nil {
			return nil, err
		}
	} else {
		t, err := st.TenantByName(ctx, name)
		if errors.Is(err, data.ErrNotFound) {
			return nil, fmt.Errorf("no tenant %q (see `tailgate tenants list`; a tenant is created with its first key)", name)
		} else if err != nil {
			return nil, err
		}
		ts = []data.Tenant{t}
	}
	spend, err := st.TenantSpend(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]gateway.TenantView, 0, len(ts))
	for _, t := range ts {
		out = append(out, gateway.ViewTenant(t, spend[t.ID], nil))
	}
	return out, nil
}

func cmdTenantsList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tenants list", "tenants list --data DIR [--json]", stderr)
	var (
		dir    = fs.String("data", "tailgate-data", "data directory")
		asJSON = fs.Bool("json", false, "print JSON (reserved_* are null: only a running gateway knows them)")
	)
	st, _, err := openCommand(fs, stderr, args, dir, "")
	if err != nil {
		return err
	}
	defer st.Close()
	views, err := tenantViews(ctx, st, "")
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(stdout, views)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tBUDGET TOKENS\tBUDGET\tSPENT TOKENS\tSPENT")
	for _, v := range views {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", v.Name, budgetTokens(v.BudgetTokens), budgetMoney(v.BudgetMicros), v.SpentTokens, money(v.SpentMicros))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stderr, reservedNote)
	return nil
}

func cmdTenantsShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tenants show", "tenants show --data DIR NAME [--json]", stderr)
	var (
		dir    = fs.String("data", "tailgate-data", "data directory")
		asJSON = fs.Bool("json", false, "print JSON (reserved_* are null: only a running gateway knows them)")
	)
	st, name, err := openCommand(fs, stderr, args, dir, "NAME of the tenant")
	if err != nil {
		return err
	}
	defer st.Close()
	views, err := tenantViews(ctx, st, name)
	if err != nil {
		return err
	}
	v := views[0]
	if *asJSON {
		return writeJSON(stdout, v)
	}
	keys, err := st.Keys(ctx, v.Name)
	if err != nil {
		return err
	}
	active, now := 0, time.Now()
	for _, k := range keys {
		if keyStatus(k, now) == "active" {
			active++
		}
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "tenant\t%s\n", v.Name)
	fmt.Fprintf(tw, "created\t%s\n", v.CreatedAt.Format(time.RFC3339))
	fmt.Fprintf(tw, "budget tokens\t%s\n", budgetTokens(v.BudgetTokens))
	fmt.Fprintf(tw, "budget\t%s\n", budgetMoney(v.BudgetMicros))
	fmt.Fprintf(tw, "spent tokens\t%d%s\n", v.SpentTokens, share(v.SpentTokens, v.BudgetTokens))
	fmt.Fprintf(tw, "spent\t%s%s\n", money(v.SpentMicros), share(v.SpentMicros, v.BudgetMicros))
	fmt.Fprintf(tw, "keys\t%d active of %d (see `tailgate keys list --tenant %s`)\n", active, len(keys), v.Name)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stderr, reservedNote)
	return nil
}

func cmdTenantsSet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tenants set", "tenants set --data DIR NAME [--budget-tokens N] [--budget AMOUNT]   (only the flags given change; 0: unlimited)", stderr)
	var (
		dir        = fs.String("data", "tailgate-data", "data directory")
		tokensFlag = fs.Int64("budget-tokens", 0, "the tenant's total token budget, prompt + completion (0: unlimited)")
		moneyFlag  = fs.Float64("budget", 0, "the tenant's money budget in currency units, e.g. 25.50 (0: unlimited)")
	)
	pos, err := parseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] == "" {
		return usageError(fs, stderr, fs.Usage, errors.New("want the NAME of the tenant"))
	}
	var tokens, micros *int64
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "budget-tokens":
			tokens = tokensFlag
		case "budget":
			m := policy.Micros(*moneyFlag)
			micros = &m
		}
	})
	if tokens == nil && micros == nil {
		return usageError(fs, stderr, fs.Usage, errors.New("nothing to change: give --budget-tokens or --budget"))
	}
	if (tokens != nil && *tokens < 0) || (micros != nil && *micros < 0) {
		return errors.New("--budget-tokens and --budget must not be negative (0: unlimited)")
	}
	st, err := openStore(*dir)
	if err != nil {
		return err
	}
	defer st.Close()
	t, err := policy.SetBudget(ctx, st, pos[0], tokens, micros)
	if errors.Is(err, data.ErrNotFound) {
		return fmt.Errorf("no tenant %q (see `tailgate tenants list`; a tenant is created with its first key)", pos[0])
	} else if err != nil {
		return err
	}
	if micros != nil && *micros > 0 {
		// This process does not know the gateway's prices.
		fmt.Fprintf(stderr, "note: tenant %q has a money budget; it counts only models the gateway prices (--price MODEL=IN,OUT, or models.MODEL.price in --config)\n", t.Name)
	}
	fmt.Fprintf(stdout, "tenant %s: budget tokens %s, budget %s; a running gateway applies it to the next request within a second\n",
		t.Name, budgetTokens(t.BudgetTokens), budgetMoney(t.BudgetMicros))
	return nil
}

func budgetTokens(n int64) string {
	if n == 0 {
		return "unlimited"
	}
	return strconv.FormatInt(n, 10)
}

func budgetMoney(micros int64) string {
	if micros == 0 {
		return "unlimited"
	}
	return money(micros)
}

func money(micros int64) string { return strconv.FormatFloat(float64(micros)/1e6, 'f', -1, 64) }

// share is " (N% of the budget)" for a limited budget.
func share(spent, budget int64) string {
	if budget <= 0 {
		return ""
	}
	return fmt.Sprintf(" (%.1f%% of the budget)", 100*float64(spent)/float64(budget))
}
