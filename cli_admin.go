package main

import (
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/gateway"
)

// cmdKeys is `tailgate keys` and its verbs.
func cmdKeys() command {
	return command{name: "keys", short: "manage API keys in a data directory", subs: []command{
		{name: "create", run: cmdKeysCreate, synopsis: "--data DIR --tenant NAME [--name N] [--owner O] [--note TEXT] [--rpm N] [--tpm N] [--max-concurrency N]\n" +
			"                       [--budget-tokens N] [--budget AMOUNT] [--budget-period daily|weekly|monthly|none] [--models a,b] [--expires 30d|720h|RFC3339]"},
		{name: "list", run: cmdKeysList, synopsis: "--data DIR [--tenant NAME] [--json]"},
		{name: "edit", run: cmdKeysEdit, synopsis: "--data DIR KEY [--name N] [--owner O] [--note TEXT] [--rpm N] [--tpm N] [--max-concurrency N] [--models a,b | --all-models] [--expires 30d|720h|RFC3339|never]"},
		{name: "rotate", run: cmdKeysRotate, synopsis: "--data DIR KEY [--grace 24h]", short: "a new secret, same key; the old one works for the grace"},
		{name: "revoke", run: cmdKeysRevoke, synopsis: "--data DIR KEY", short: "KEY: key id, display prefix, tenant/name, or the secret"},
	}}
}

func cmdKeysCreate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("keys create", "keys create --data DIR --tenant NAME [--name N] [--owner O] [--note TEXT] [--rpm N] [--tpm N] [--max-concurrency N] [--budget-tokens N] [--budget N]\n"+
		"  [--budget-period daily|weekly|monthly|none] [--budget-alert-percent P] [--models a,b] [--expires 30d|720h|RFC3339] [--class interactive|standard|batch]", stderr)
	var (
		dir         = fs.String("data", "tailgate-data", "data directory")
		tenant      = fs.String("tenant", "", "tenant that owns the key (created if new)")
		rpm         = fs.Int64("rpm", 0, "requests per minute for this key (0: unlimited)")
		tpm         = fs.Int64("tpm", 0, "tokens per minute for this key (0: unlimited)")
		maxConc     = fs.Int64("max-concurrency", 0, "concurrent requests for this key (0: unlimited)")
		tokenBudget = fs.Int64("budget-tokens", -1, "set the tenant's total token budget (0: unlimited; default: unchanged)")
		moneyBudget = fs.Float64("budget", -1, "set the tenant's money budget in currency units (0: unlimited; default: unchanged)")
		models      = fs.String("models", "", "comma-separated models the key may use (default: all)")
		expires     = fs.String("expires", "", "when the key stops working: a duration from now (30d, 720h) or a time in RFC 3339 (default: never)")
		class       = fs.String("class", "standard", "priority class, the highest the key's requests run as: interactive, standard or batch (under load, lower classes wait)")
		name        = fs.String("name", "", "the key's name, unique among the tenant's active keys (e.g. bob-laptop)")
		owner       = fs.String("owner", "", "who holds the key (e.g. bob@example.com)")
		note        = fs.String("note", "", "what the key is for")
		period      = fs.String("budget-period", "", "set when the tenant's budget resets: daily, weekly, monthly (calendar periods in UTC) or none (default: unchanged)")
		alert       = fs.Int64("budget-alert-percent", 0, "set the tenant's soft threshold, 1-100 (default: unchanged; a new tenant has 80)")
	)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := data.CheckKeyName(*name); err != nil {
		return usageError(fs, stderr, fs.Usage, fmt.Errorf("--name: %w", err))
	}
	if *tenant == "" {
		fmt.Fprintln(stderr, "tailgate keys create: --tenant is required")
		return errUsage
	}
	if *rpm < 0 || *tpm < 0 || *maxConc < 0 {
		return errors.New("--rpm, --tpm and --max-concurrency must not be negative")
	}
	opts := policy.KeyOptions{Tenant: *tenant, RPM: *rpm, TPM: *tpm, MaxConcurrency: *maxConc, Models: splitModels(*models),
		Name: *name, Owner: *owner, Note: *note}
	if flagGiven(fs, "budget-period") {
		p := policy.NormalizePeriod(*period)
		if err := data.CheckBudgetPeriod(p); err != nil {
			return usageError(fs, stderr, fs.Usage, fmt.Errorf("--budget-period: %w", err))
		}
		opts.BudgetPeriod = &p
	}
	if flagGiven(fs, "budget-alert-percent") {
		if *alert < 1 || *alert > 100 {
			return usageError(fs, stderr, fs.Usage, errors.New("--budget-alert-percent: want 1 to 100"))
		}
		opts.BudgetAlertPercent = alert
	}
	c, err := policy.ParseClass(*class)
	if err != nil {
		return usageError(fs, stderr, fs.Usage, fmt.Errorf("--class: %w", err))
	}
	opts.Class = c
	if *expires != "" {
		exp, err := policy.ParseExpiry(*expires, time.Now())
		if err != nil {
			return usageError(fs, stderr, fs.Usage, fmt.Errorf("--expires: %w", err))
		}
		opts.ExpiresAt = exp
	}
	if *tokenBudget >= 0 {
		opts.BudgetTokens = tokenBudget
	}
	if *moneyBudget >= 0 {
		micros := policy.Micros(*moneyBudget)
		opts.BudgetMicros = &micros
	}
	st, err := openStore(*dir)
	if err != nil {
		return err
	}
	defer st.Close()
	secret, k, err := policy.CreateKey(ctx, st, opts)
	if errors.Is(err, data.ErrNameTaken) {
		return fmt.Errorf("tenant %q has an active key named %q: pick another --name, or revoke that key first", *tenant, *name)
	} else if err != nil {
		return err
	}
	if *moneyBudget > 0 {
		// This process does not know the gateway's prices.
		fmt.Fprintf(stderr, "note: tenant %q has a money budget; it counts only models the gateway prices (--price MODEL=IN,OUT, or models.MODEL.price in --config): "+
			"a gateway refuses to start while no model the tenant may use has a price, and a running one warns\n", k.Tenant.Name)
	}
	if !k.ExpiresAt.IsZero() {
		fmt.Fprintf(stderr, "the key expires at %s (extend it with `tailgate keys edit %s --expires ...`)\n", k.ExpiresAt.Format(time.RFC3339), k.Prefix)
	}
	if k.Tenant.BudgetPeriod != "" {
		fmt.Fprintf(stderr, "tenant %q's budget resets %s at 00:00 UTC (next: %s)\n", k.Tenant.Name, k.Tenant.BudgetPeriod,
			data.PeriodEnd(k.Tenant.BudgetPeriod, time.Now()).Format(time.RFC3339))
	}
	fmt.Fprintf(stderr, "created key %s (%s%s) for tenant %q; the secret is shown once:\n", k.ID, k.Prefix, keyNameNote(k), k.Tenant.Name)
	fmt.Fprintln(stdout, secret)
	return nil
}

func cmdKeysList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("keys list", "keys list --data DIR [--tenant NAME] [--json]", stderr)
	var (
		dir    = fs.String("data", "tailgate-data", "data directory")
		tenant = fs.String("tenant", "", "only this tenant's keys")
		asJSON = fs.Bool("json", false, "print JSON")
	)
	st, _, err := openCommand(fs, stderr, args, dir, "")
	if err != nil {
		return err
	}
	defer st.Close()
	keys, err := st.Keys(ctx, *tenant)
	if err != nil {
		return err
	}
	spend, err := st.KeySpend(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	if *asJSON {
		out := make([]gateway.KeyView, 0, len(keys))
		for _, k := range keys {
			out = append(out, gateway.ViewKey(k, now).WithSpend(spend[k.ID]))
		}
		return writeJSON(stdout, out)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPREFIX\tTENANT\tNAME\tOWNER\tRPM\tTPM\tCONC\tMODELS\tCLASS\tREQUESTS\tTOKENS\tSPENT\tLAST USED\tCREATED\tEXPIRES\tSTATUS")
	for _, k := range keys {
		sp := spend[k.ID]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Prefix, k.Tenant.Name,
			orDash(k.Name), orDash(k.Owner), limit(k.RPM), limit(k.TPM), limit(k.MaxConcurrency), keyModels(k), k.Class,
			sp.Requests, sp.Tokens, money(sp.Micros), lastUsed(k), k.CreatedAt.Format(time.RFC3339), keyExpiry(k), keyStatus(k, now))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// lastUsed is when the key was last used, to the minute ("never").
func lastUsed(k data.Key) string {
	if k.LastUsedAt.IsZero() {
		return "never"
	}
	return k.LastUsedAt.Truncate(time.Minute).Format(time.RFC3339)
}

// keyNameNote is ", name N" for a named key.
func keyNameNote(k data.Key) string {
	if k.Name == "" {
		return ""
	}
	return ", name " + k.Name
}

func cmdKeysRotate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("keys rotate", "keys rotate --data DIR KEY [--grace 24h]   (KEY: key id, display prefix, tenant/name, or the secret)\n"+
		"  (a new secret for the same key — id, name, limits, spend; the old secret keeps working for the grace, then is refused)", stderr)
	var (
		dir   = fs.String("data", "tailgate-data", "data directory")
		grace = fs.Duration("grace", policy.DefaultRotateGrace, "how long the old secret keeps working (0s: it stops at once)")
	)
	pos, err := parseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) != 1 || strings.TrimSpace(pos[0]) == "" {
		return usageError(fs, stderr, fs.Usage, errors.New("want the KEY to rotate"))
	}
	if *grace < 0 {
		return usageError(fs, stderr, fs.Usage, errors.New("--grace must not be negative (0s: the old secret stops at once)"))
	}
	st, err := openStore(*dir)
	if err != nil {
		return err
	}
	defer st.Close()
	secret, k, err := policy.RotateKey(ctx, st, pos[0], *grace, time.Now())
	switch {
	case errors.Is(err, data.ErrNotFound):
		return errors.New("no key matches that id, prefix, name or secret")
	case errors.Is(err, data.ErrAmbiguous):
		return errors.New("that prefix or name matches more than one key; give the key id or tenant/name (see `tailgate keys list`)")
	case errors.Is(err, data.ErrRevoked):
		return errors.New("that key is revoked and cannot be rotated; create a new one")
	case err != nil:
		return err
	}
	if k.PrevUntil.IsZero() {
		fmt.Fprintf(stderr, "rotated %s (tenant %s%s): the old secret stops working within a second\n", k.ID, k.Tenant.Name, keyNameNote(k))
	} else {
		fmt.Fprintf(stderr, "rotated %s (tenant %s%s): the old secret works until %s, then is refused\n", k.ID, k.Tenant.Name, keyNameNote(k),
			k.PrevUntil.Format(time.RFC3339))
	}
	fmt.Fprintf(stderr, "the new secret (%s) is shown once:\n", k.Prefix)
	fmt.Fprintln(stdout, secret)
	return nil
}

func keyModels(k data.Key) string {
	if len(k.Models) == 0 {
		return "*"
	}
	return strings.Join(k.Models, ",")
}

func keyExpiry(k data.Key) string {
	if k.ExpiresAt.IsZero() {
		return "never"
	}
	return k.ExpiresAt.Format(time.RFC3339)
}

// splitModels reads a --models list; blanks between commas are dropped.
func splitModels(s string) []string {
	var out []string
	for _, m := range strings.Split(s, ",") {
		if m = strings.TrimSpace(m); m != "" {
			out = append(out, m)
		}
	}
	return out
}

func cmdKeysEdit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("keys edit", "keys edit --data DIR KEY [--name N] [--owner O] [--note TEXT] [--rpm N] [--tpm N] [--max-concurrency N] [--models a,b | --all-models] [--expires 30d|720h|RFC3339|never] [--class interactive|standard|batch]\n"+
		"  (KEY: key id, display prefix, tenant/name, or the secret; only the flags given change)", stderr)
	var (
		dir       = fs.String("data", "tailgate-data", "data directory")
		rpm       = fs.Int64("rpm", 0, "requests per minute (0: unlimited)")
		tpm       = fs.Int64("tpm", 0, "tokens per minute (0: unlimited)")
		maxConc   = fs.Int64("max-concurrency", 0, "concurrent requests (0: unlimited)")
		models    = fs.String("models", "", "comma-separated models the key may use, replacing its list")
		allModels = fs.Bool("all-models", false, "let the key use every model (clears its list)")
		expires   = fs.String("expires", "", "new expiry: a duration from now (30d, 720h), a time in RFC 3339, or never")
		class     = fs.String("class", "", "new priority class: interactive, standard or batch")
		name      = fs.String("name", "", "new name, unique among the tenant's active keys (\"\" clears it)")
		owner     = fs.String("owner", "", "who holds the key")
		note      = fs.String("note", "", "what the key is for")
	)
	pos, err := parseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) != 1 || strings.TrimSpace(pos[0]) == "" {
		return usageError(fs, stderr, fs.Usage, errors.New("want the KEY to edit"))
	}
	var u data.KeyUpdate
	var bad error
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "rpm":
			u.RPM = rpm
		case "tpm":
			u.TPM = tpm
		case "max-concurrency":
			u.MaxConcurrency = maxConc
		case "models":
			if m := splitModels(*models); len(m) > 0 {
				u.Models = &m
			} else {
				bad = errors.New("--models is empty: to let the key use every model, give --all-models")
			}
		case "expires":
			exp, err := policy.ParseExpiry(*expires, time.Now())
			if err != nil {
				bad = fmt.Errorf("--expires: %w", err)
			}
			u.ExpiresAt = &exp
		case "class":
			if _, err := policy.ParseClass(*class); err != nil || *class == "" {
				bad = errors.New("--class: want interactive, standard or batch")
			}
			u.Class = class
		case "name":
			if err := data.CheckKeyName(*name); err != nil {
				bad = fmt.Errorf("--name: %w", err)
			}
			u.Name = name
		case "owner":
			u.Owner = owner
		case "note":
			u.Note = note
		}
	})
	switch {
	case bad != nil:
		return usageError(fs, stderr, fs.Usage, bad)
	case *allModels && u.Models != nil:
		return usageError(fs, stderr, fs.Usage, errors.New("give --models or --all-models, not both"))
	case *allModels:
		u.Models = &[]string{}
	}
	if u.RPM == nil && u.TPM == nil && u.MaxConcurrency == nil && u.Models == nil && u.ExpiresAt == nil && u.Class == nil &&
		u.Name == nil && u.Owner == nil && u.Note == nil {
		return usageError(fs, stderr, fs.Usage, errors.New("nothing to change: give --rpm, --tpm, --max-concurrency, --models, --all-models, --expires, --class, --name, --owner or --note"))
	}
	if (u.RPM != nil && *u.RPM < 0) || (u.TPM != nil && *u.TPM < 0) || (u.MaxConcurrency != nil && *u.MaxConcurrency < 0) {
		return errors.New("--rpm, --tpm and --max-concurrency must not be negative")
	}
	st, err := openStore(*dir)
	if err != nil {
		return err
	}
	defer st.Close()
	k, err := policy.EditKey(ctx, st, pos[0], u)
	switch {
	case errors.Is(err, data.ErrNotFound):
		return errors.New("no key matches that id, prefix or secret")
	case errors.Is(err, data.ErrAmbiguous):
		return errors.New("that prefix matches more than one key; give the key id (see `tailgate keys list`)")
	case errors.Is(err, data.ErrRevoked):
		return errors.New("that key is revoked and cannot be edited; create a new one")
	case errors.Is(err, data.ErrNameTaken):
		return fmt.Errorf("another active key of the tenant is named %q: pick another --name", *name)
	case err != nil:
		return err
	}
	fmt.Fprintf(stdout, "edited %s (%s, tenant %s): rpm %s, tpm %s, concurrency %s, models %s, expires %s, class %s (%s); a running gateway applies it within a second\n",
		k.ID, k.Prefix, k.Tenant.Name, limit(k.RPM), limit(k.TPM), limit(k.MaxConcurrency), keyModels(k), keyExpiry(k), k.Class, keyStatus(k, time.Now()))
	return nil
}

func limit(v int64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprint(v)
}

func cmdKeysRevoke(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("keys revoke", "keys revoke --data DIR KEY   (KEY: key id, display prefix, or the secret)", stderr)
	dir := fs.String("data", "tailgate-data", "data directory")
	st, ref, err := openCommand(fs, stderr, args, dir, "KEY to revoke")
	if err != nil {
		return err
	}
	defer st.Close()
	k, err := policy.RevokeKey(ctx, st, ref)
	switch {
	case errors.Is(err, data.ErrNotFound):
		return errors.New("no key matches that id, prefix or secret")
	case errors.Is(err, data.ErrAmbiguous):
		return errors.New("that prefix matches more than one key; give the key id (see `tailgate keys list`)")
	case err != nil:
		return err
	}
	fmt.Fprintf(stdout, "revoked %s (%s, tenant %s); a running gateway rejects it within a second\n", k.ID, k.Prefix, k.Tenant.Name)
	return nil
}

func cmdUsage(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("usage", "usage --data DIR [--tenant NAME] [--since WHEN] [--until WHEN] [--by day|week|month|tenant|key|model] [--json|--csv]\n"+
		"  (WHEN: a date 2026-11-01, a time in RFC 3339, or a duration ago such as 7d or 24h; --until is exclusive; periods are UTC)", stderr)
	var (
		dir    = fs.String("data", "tailgate-data", "data directory")
		tenant = fs.String("tenant", "", "only this tenant")
		since  = fs.String("since", "", "only requests from this time on: a date (2026-11-01), RFC 3339, or a duration ago (7d, 24h)")
		until  = fs.String("until", "", "only requests before this time (same forms as --since)")
		by     = fs.String("by", "", "group by day, week (from Monday), month, tenant, key or model (default: tenant, key and model)")
		asJSON = fs.Bool("json", false, "print JSON")
		asCSV  = fs.Bool("csv", false, "print CSV (a header line, then one line per total)")
	)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *asJSON && *asCSV {
		return usageError(fs, stderr, fs.Usage, errors.New("give --json or --csv, not both"))
	}
	f := data.UsageFilter{Tenant: *tenant, By: *by}
	if err := data.CheckUsageBy(f.By); err != nil {
		return usageError(fs, stderr, fs.Usage, fmt.Errorf("--by: %w", err))
	}
	now := time.Now()
	for _, b := range []struct {
		name, v string
		dst     *time.Time
	}{{"since", *since, &f.Since}, {"until", *until, &f.Until}} {
		if b.v == "" {
			continue
		}
		t, err := data.ParseUsageTime(b.v, now)
		if err != nil {
			return usageError(fs, stderr, fs.Usage, fmt.Errorf("--%s: %w", b.name, err))
		}
		*b.dst = t
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return usageError(fs, stderr, fs.Usage, fmt.Errorf("--until %s is not after --since %s", f.Until.Format(time.RFC3339), f.Since.Format(time.RFC3339)))
	}
	st, err := openStore(*dir)
	if err != nil {
		return err
	}
	defer st.Close()
	rows, err := st.Usage(ctx, f)
	if err != nil {
		return err
	}
	view := gateway.UsageJSON(rows)
	if *asJSON {
		return writeJSON(stdout, view)
	}
	header := []string{"PERIOD", "TENANT", "KEY", "KEY_ID", "MODEL", "REQUESTS", "PROMPT", "COMPLETION", "COST", "REJECTED"}
	line := func(r gateway.UsageView) []string {
		period := ""
		if r.Period != nil {
			period = *r.Period
		}
		key := r.KeyName
		if key == "" {
			key = r.KeyPrefix
		}
		return []string{period, r.Tenant, key, r.KeyID, r.Model, strconv.FormatInt(r.Requests, 10), strconv.FormatInt(r.PromptTokens, 10),
			strconv.FormatInt(r.CompletionTokens, 10), strconv.FormatFloat(r.Cost, 'f', 6, 64), strconv.FormatInt(r.Rejected, 10)}
	}
	if *asCSV {
		w := csv.NewWriter(stdout)
		lower := make([]string, len(header))
		for i, h := range header {
			lower[i] = strings.ToLower(h)
		}
		_ = w.Write(lower)
		for _, r := range view {
			_ = w.Write(line(r))
		}
		w.Flush()
		return w.Error()
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range view {
		cells := line(r)
		for i, c := range cells {
			if c == "" {
				cells[i] = "-"
			}
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}
