package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"tailgate/data"
	"tailgate/policy"
	"tailgate/server/gateway"
)

const keysUsage = `Usage:
  tailgate keys create --data DIR --tenant NAME [--rpm N] [--tpm N] [--max-concurrency N] [--budget-tokens N] [--budget AMOUNT] [--models a,b] [--expires 30d|720h|RFC3339]
  tailgate keys list   --data DIR [--tenant NAME] [--json]
  tailgate keys edit   --data DIR KEY [--rpm N] [--tpm N] [--max-concurrency N] [--models a,b | --all-models] [--expires 30d|720h|RFC3339|never]
  tailgate keys revoke --data DIR KEY   (KEY: key id, display prefix, or the secret)

Run 'tailgate keys SUBCOMMAND -h' for its flags.
`

func cmdKeys(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return dispatch(ctx, "keys", keysUsage, []subcommand{
		{"create", cmdKeysCreate},
		{"list", cmdKeysList},
		{"edit", cmdKeysEdit},
		{"revoke", cmdKeysRevoke},
	}, args, stdout, stderr)
}

func cmdKeysCreate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("keys create", "keys create --data DIR --tenant NAME [--rpm N] [--tpm N] [--max-concurrency N] [--budget-tokens N] [--budget N] [--models a,b] [--expires 30d|720h|RFC3339] [--class interactive|standard|batch]", stderr)
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
	)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *tenant == "" {
		fmt.Fprintln(stderr, "tailgate keys create: --tenant is required")
		return errUsage
	}
	if *rpm < 0 || *tpm < 0 || *maxConc < 0 {
		return errors.New("--rpm, --tpm and --max-concurrency must not be negative")
	}
	opts := policy.KeyOptions{Tenant: *tenant, RPM: *rpm, TPM: *tpm, MaxConcurrency: *maxConc, Models: splitModels(*models)}
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
	if err != nil {
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
	fmt.Fprintf(stderr, "created key %s (%s) for tenant %q; the secret is shown once:\n", k.ID, k.Prefix, k.Tenant.Name)
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
	now := time.Now()
	if *asJSON {
		out := make([]gateway.KeyView, 0, len(keys))
		for _, k := range keys {
			out = append(out, gateway.ViewKey(k, now))
		}
		return writeJSON(stdout, out)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPREFIX\tTENANT\tRPM\tTPM\tCONC\tMODELS\tCLASS\tCREATED\tEXPIRES\tSTATUS")
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Prefix, k.Tenant.Name, limit(k.RPM), limit(k.TPM),
			limit(k.MaxConcurrency), keyModels(k), k.Class, k.CreatedAt.Format(time.RFC3339), keyExpiry(k), keyStatus(k, now))
	}
	return tw.Flush()
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
	fs := newFlagSet("keys edit", "keys edit --data DIR KEY [--rpm N] [--tpm N] [--max-concurrency N] [--models a,b | --all-models] [--expires 30d|720h|RFC3339|never] [--class interactive|standard|batch]\n"+
		"  (KEY: key id, display prefix, or the secret; only the flags given change)", stderr)
	var (
		dir       = fs.String("data", "tailgate-data", "data directory")
		rpm       = fs.Int64("rpm", 0, "requests per minute (0: unlimited)")
		tpm       = fs.Int64("tpm", 0, "tokens per minute (0: unlimited)")
		maxConc   = fs.Int64("max-concurrency", 0, "concurrent requests (0: unlimited)")
		models    = fs.String("models", "", "comma-separated models the key may use, replacing its list")
		allModels = fs.Bool("all-models", false, "let the key use every model (clears its list)")
		expires   = fs.String("expires", "", "new expiry: a duration from now (30d, 720h), a time in RFC 3339, or never")
		class     = fs.String("class", "", "new priority class: interactive, standard or batch")
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
	if u.RPM == nil && u.TPM == nil && u.MaxConcurrency == nil && u.Models == nil && u.ExpiresAt == nil && u.Class == nil {
		return usageError(fs, stderr, fs.Usage, errors.New("nothing to change: give --rpm, --tpm, --max-concurrency, --models, --all-models, --expires or --class"))
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
	fs := newFlagSet("usage", "usage --data DIR [--tenant NAME] [--since RFC3339|DURATION] [--json]", stderr)
	var (
		dir    = fs.String("data", "tailgate-data", "data directory")
		tenant = fs.String("tenant", "", "only this tenant")
		since  = fs.String("since", "", "only requests since a time (RFC 3339) or a duration ago (e.g. 24h, 7d)")
		asJSON = fs.Bool("json", false, "print JSON")
	)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	f := data.UsageFilter{Tenant: *tenant}
	if *since != "" {
		if d, err := parseDuration(*since); err == nil {
			f.Since = time.Now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339, *since); err == nil {
			f.Since = t
		} else {
			return usageError(fs, stderr, fs.Usage, fmt.Errorf("--since %q: want a time in RFC 3339 (2027-01-31T00:00:00Z) or a duration ago (24h, 7d)", *since))
		}
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
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tKEY\tMODEL\tREQUESTS\tPROMPT\tCOMPLETION\tCOST\tREJECTED")
	for _, r := range view {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%.6f\t%d\n", r.Tenant, r.KeyPrefix, r.Model, r.Requests, r.PromptTokens, r.CompletionTokens, r.Cost, r.Rejected)
	}
	return tw.Flush()
}
