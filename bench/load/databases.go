package load

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// PostgresFunc starts a PostgreSQL server the databases scenario may use
// and returns the URL of an empty database on it and how to stop it. The
// bench imports nothing of the product, so the command supplies it.
type PostgresFunc func(ctx context.Context) (url string, stop func() error, err error)

// LedgerCheck compares what a side's ledger billed for the bench's tenant
// with what its clients received.
type LedgerCheck struct {
	// Billed: the ledger's requests (refusals left out), and its
	// completion tokens.
	Requests         int64 `json:"requests"`
	CompletionTokens int64 `json:"completion_tokens"`
	Rejected         int64 `json:"rejected"`
	// Received: the answers the clients got whole, and the completion
	// tokens their usage reported.
	Answers                  int   `json:"answers"`
	ReceivedCompletionTokens int64 `json:"received_completion_tokens"`
	// Match: every answer billed once, token for token, nothing more.
	Match bool `json:"match"`
}

func (c LedgerCheck) String() string {
	verdict := "match"
	if !c.Match {
		verdict = "MISMATCH"
	}
	return fmt.Sprintf("ledger: %d requests, %d completion tokens billed (%d refused); clients received %d answers, %d completion tokens: %s",
		c.Requests, c.CompletionTokens, c.Rejected, c.Answers, c.ReceivedCompletionTokens, verdict)
}

// databaseArm is one side of the databases scenario.
type databaseArm struct {
	label    string
	gateways int
	postgres bool
}

// runDatabases runs the databases scenario: the same seeded load through
// one gateway on SQLite (A), then through two gateways on one PostgreSQL
// (B), the requests alternating between them as clients behind one DNS
// name would; each side with a key that has limits and a tenant with a
// token budget, so every request takes the database's paths (reservation,
// limits, ledger). Each side's ledger is then checked against what its
// clients received; a mismatch is an error.
func (b *bench) runDatabases(ctx context.Context) ([]*Report, error) {
	o := &b.opts
	if o.Postgres == nil {
		return nil, errors.New("scenario databases: no way to start PostgreSQL was given (Options.Postgres)")
	}
	fmt.Fprintln(o.Stderr, "bench: starting a throwaway PostgreSQL on 127.0.0.1 for side B")
	url, stop, err := o.Postgres(ctx)
	if err != nil {
		return nil, fmt.Errorf("scenario databases: %w", err)
	}
	defer func() { _ = stop() }()

	arms := []databaseArm{
		{label: "A: 1 gateway on SQLite", gateways: 1},
		{label: "B: 2 gateways on one PostgreSQL", gateways: 2, postgres: true},
	}
	var reports []*Report
	var mismatch []string
	for _, arm := range arms {
		if ctx.Err() != nil {
			break
		}
		cfg, err := b.fleetConfig(b.sides[0])
		if err != nil {
			return reports, err
		}
		cfg.Gateways, cfg.KeyArgs = arm.gateways, databaseKeyArgs(o.Rate)
		if arm.postgres {
			cfg.GatewayArgs = append([]string{"--database", url}, cfg.GatewayArgs...)
		}
		rep, check, err := b.runDatabaseArm(ctx, arm, cfg)
		if rep != nil {
			reports = append(reports, rep)
		}
		if err != nil {
			return reports, err
		}
		if !check.Match {
			mismatch = append(mismatch, arm.label)
		}
	}
	if len(mismatch) > 0 {
		return reports, fmt.Errorf("scenario databases: the ledger of %v does not match what the clients received (see its notes)", mismatch)
	}
	return reports, nil
}

// runDatabaseArm starts one side's fleet, runs the plan on it, checks its
// ledger and tears it down.
func (b *bench) runDatabaseArm(ctx context.Context, arm databaseArm, cfg LocalConfig) (*Report, LedgerCheck, error) {
	fleet, err := StartLocal(ctx, cfg)
	if err != nil {
		return nil, LedgerCheck{}, err
	}
	defer func() {
		fleet.Close()
		if b.opts.Keep {
			fmt.Fprintf(b.opts.Stderr, "bench: kept %s (gateway data and logs)\n", fleet.Dir())
		}
	}()
	t := fleet.Target()
	t.Label = arm.label
	rep, err := b.runOne(ctx, t, b.sides[0].Model, fleet)
	if rep == nil {
		return nil, LedgerCheck{}, err
	}
	// The answers were billed before they were sent; ask a little while
	// for the last rows of a stopped run.
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	check, lerr := ledgerCheck(lctx, t, rep)
	if lerr != nil {
		rep.Notes = append(rep.Notes, "ledger: could not be read: "+lerr.Error())
		return rep, LedgerCheck{Match: true}, errors.Join(err, fmt.Errorf("%s: ledger: %w", arm.label, lerr))
	}
	rep.Ledger = &check
	rep.Notes = append(rep.Notes, check.String())
	fmt.Fprintf(b.opts.Stderr, "bench: %s — %s\n", arm.label, check)
	return rep, check, err
}

// databaseKeyArgs are the limits of the bench's key and its tenant's
// budget: real, so each request reserves and settles against them, and
// well above what the run sends (ten times the rate, split over the
// gateways), so none is refused.
func databaseKeyArgs(rate float64) []string {
	rpm := int64(math.Max(1000, math.Ceil(rate*60*10)))
	return []string{
		"--rpm", strconv.FormatInt(rpm, 10),
		"--tpm", strconv.FormatInt(rpm*10_000, 10),
		"--max-concurrency", "4096",
		"--budget-tokens", "1000000000000",
	}
}

// ledgerCheck reads the bench tenant's ledger totals from the (first)
// gateway's admin API and sets them against the run's answers.
func ledgerCheck(ctx context.Context, t Target, rep *Report) (LedgerCheck, error) {
	var usage struct {
		Data []struct {
			Requests         int64 `json:"requests"`
			CompletionTokens int64 `json:"completion_tokens"`
			Rejected         int64 `json:"rejected"`
		} `json:"data"`
	}
	if err := newAdmin(t.AdminURL, t.AdminToken, "").get(ctx, "/admin/v1/usage?tenant=bench", &usage); err != nil {
		return LedgerCheck{}, err
	}
	var c LedgerCheck
	for _, u := range usage.Data {
		c.Requests += u.Requests
		c.CompletionTokens += u.CompletionTokens
		c.Rejected += u.Rejected
	}
	for i := range rep.Requests {
		if r := &rep.Requests[i]; r.OK() {
			c.Answers++
			c.ReceivedCompletionTokens += int64(r.Completion)
		}
	}
	c.Match = c.Requests == int64(c.Answers) && c.CompletionTokens == c.ReceivedCompletionTokens
	return c, nil
}
