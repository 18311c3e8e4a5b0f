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

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/gateway"
)

// cmdTenants is `tailgate tenants` and its verbs.
func cmdTenants() command {
	return command{name: "tenants", short: "tenants' budgets and what they spent", notes: tenantsNotes, subs: []command{
		{name: "list", run: cmdTenantsList, synopsis: "--data DIR [--json]"},
		{name: "show", run: cmdTenantsShow, synopsis: "--data DIR NAME [--json]"},
		{name: "set", run: cmdTenantsSet, synopsis: "--data DIR NAME [--budget-tokens N] [--budget AMOUNT] [--budget-period daily|weekly|monthly|none] [--budget-alert-percent P]"},
	}}
}

const tenantsNotes = `Budgets are totals (0: unlimited) over the tenant's life, or over each calendar
day, week (from Monday) or month in UTC with --budget-period; in-flight
reservations: GET /admin/v1/tenants.
`

// reservedNote says why the CLI shows no reserved amounts.
const reservedNote = "note: reserved (in-flight) amounts are known only to a running gateway: GET /admin/v1/tenants on its admin listener shows them"

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
	now := time.Now()
	for _, t := range ts {
		v := gateway.ViewTenant(t, spend[t.ID], nil)
		if t.BudgetPeriod != "" {
			sp, err := st.TenantPeriodSpend(ctx, t.ID, data.PeriodStart(t.BudgetPeriod, now))
			if err != nil {
				return nil, err
			}
			v = v.WithPeriod(sp, data.PeriodEnd(t.BudgetPeriod, now))
		}
		out = append(out, v)
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
	fmt.Fprintln(tw, "TENANT\tBUDGET TOKENS\tBUDGET\tPERIOD\tSPENT TOKENS\tSPENT\tRESETS")
	for _, v := range views {
		// A periodic budget's spent columns are the current period's.
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", v.Name, budgetTokens(v.BudgetTokens), budgetMoney(v.BudgetMicros),
			periodName(v.BudgetPeriod), v.PeriodSpentTokens, money(v.PeriodSpentMicros), resetsAt(v))
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
	fmt.Fprintf(tw, "budget period\t%s\n", periodName(v.BudgetPeriod))
	fmt.Fprintf(tw, "alert at\t%d%% of the budget\n", v.BudgetAlertPercent)
	if v.BudgetPeriod != "" {
		fmt.Fprintf(tw, "spent tokens this period\t%d%s\n", v.PeriodSpentTokens, share(v.PeriodSpentTokens, v.BudgetTokens))
		fmt.Fprintf(tw, "spent this period\t%s%s\n", money(v.PeriodSpentMicros), share(v.PeriodSpentMicros, v.BudgetMicros))
		fmt.Fprintf(tw, "resets\t%s\n", resetsAt(v))
		fmt.Fprintf(tw, "spent tokens, all time\t%d\n", v.SpentTokens)
		fmt.Fprintf(tw, "spent, all time\t%s\n", money(v.SpentMicros))
	} else {
		fmt.Fprintf(tw, "spent tokens\t%d%s\n", v.SpentTokens, share(v.SpentTokens, v.BudgetTokens))
		fmt.Fprintf(tw, "spent\t%s%s\n", money(v.SpentMicros), share(v.SpentMicros, v.BudgetMicros))
	}
	fmt.Fprintf(tw, "keys\t%d active of %d (see `tailgate keys list --tenant %s`)\n", active, len(keys), v.Name)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stderr, reservedNote)
	return nil
}

func cmdTenantsSet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tenants set", "tenants set --data DIR NAME [--budget-tokens N] [--budget AMOUNT] [--budget-period daily|weekly|monthly|none] [--budget-alert-percent P]\n"+
		"  (only the flags given change; 0: unlimited)", stderr)
	var (
		dir        = fs.String("data", "tailgate-data", "data directory")
		tokensFlag = fs.Int64("budget-tokens", 0, "the tenant's token budget, prompt + completion (0: unlimited)")
		moneyFlag  = fs.Float64("budget", 0, "the tenant's money budget in currency units, e.g. 25.50 (0: unlimited)")
		periodFlag = fs.String("budget-period", "", "when the budget resets: daily, weekly (Monday), monthly — calendar periods in UTC — or none (a lifetime total)")
		alertFlag  = fs.Int64("budget-alert-percent", 80, "the soft threshold, 1-100: the gateway's tailgate_budget_used_ratio crosses it, and --budget-webhook is told once per period")
	)
	pos, err := parseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] == "" {
		return usageError(fs, stderr, fs.Usage, errors.New("want the NAME of the tenant"))
	}
	var c policy.BudgetChange
	var bad error
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "budget-tokens":
			c.Tokens = tokensFlag
		case "budget":
			m := policy.Micros(*moneyFlag)
			c.Micros = &m
		case "budget-period":
			p := policy.NormalizePeriod(*periodFlag)
			if err := data.CheckBudgetPeriod(p); err != nil {
				bad = fmt.Errorf("--budget-period: %w", err)
			}
			c.Period = &p
		case "budget-alert-percent":
			if *alertFlag < 1 || *alertFlag > 100 {
				bad = errors.New("--budget-alert-percent: want 1 to 100")
			}
			c.AlertPercent = alertFlag
		}
	})
	if bad != nil {
		return usageError(fs, stderr, fs.Usage, bad)
	}
	if c.Tokens == nil && c.Micros == nil && c.Period == nil && c.AlertPercent == nil {
		return usageError(fs, stderr, fs.Usage, errors.New("nothing to change: give --budget-tokens, --budget, --budget-period or --budget-alert-percent"))
	}
	if (c.Tokens != nil && *c.Tokens < 0) || (c.Micros != nil && *c.Micros < 0) {
		return errors.New("--budget-tokens and --budget must not be negative (0: unlimited)")
	}
	micros := c.Micros
	st, err := openStore(*dir)
	if err != nil {
		return err
	}
	defer st.Close()
	t, err := policy.ChangeBudget(ctx, st, pos[0], c)
	if errors.Is(err, data.ErrNotFound) {
		return fmt.Errorf("no tenant %q (see `tailgate tenants list`; a tenant is created with its first key)", pos[0])
	} else if err != nil {
		return err
	}
	if micros != nil && *micros > 0 {
		// This process does not know the gateway's prices.
		fmt.Fprintf(stderr, "note: tenant %q has a money budget; it counts only models the gateway prices (--price MODEL=IN,OUT, or models.MODEL.price in --config)\n", t.Name)
	}
	fmt.Fprintf(stdout, "tenant %s: budget tokens %s, budget %s, period %s, alert at %d%%; a running gateway applies it to the next request within a second\n",
		t.Name, budgetTokens(t.BudgetTokens), budgetMoney(t.BudgetMicros), periodName(t.BudgetPeriod), t.BudgetAlertPercent)
	return nil
}

func periodName(p string) string {
	if p == "" {
		return "none"
	}
	return p
}

// resetsAt is when a periodic budget resets, "never" for a lifetime one.
func resetsAt(v gateway.TenantView) string {
	if v.BudgetResetsAt == nil {
		return "never"
	}
	return v.BudgetResetsAt.Format(time.RFC3339)
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

// share is " (N% of the budget)" for a limited budget.
func share(spent, budget int64) string {
	if budget <= 0 {
		return ""
	}
	return fmt.Sprintf(" (%.1f%% of the budget)", 100*float64(spent)/float64(budget))
}
