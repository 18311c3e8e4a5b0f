// Package policy decides who may do what: it turns API keys into principals,
// enforces per-key rate and concurrency limits and per-tenant budgets, prices
// requests and settles their real usage.
//
// # Overview
//
// Secrets are minted by [NewSecret] and stored only as a SHA-256 hash (see
// [CreateKey], [RevokeKey]); a secret never appears in an error or a log line.
//
// A [Gate], made by [New] from a [Config] (the models' prices) over the
// data store, serves the request path. [Gate.Authenticate] resolves a secret to a
// [Principal] through an in-memory cache in front of SQLite; unknown and
// revoked keys are cached too, so a flood of bad keys never reaches the
// database. [Gate.Run] polls the database's key version and drops the cache
// (and reloads tenant budgets) when another process — `tailgate keys` — changed
// a key or a budget, so a revocation bites within one poll interval.
//
// [Gate.Admit] checks one request against its key's limits and its tenant's
// budget and, if it passes, takes a [Ticket] that holds a concurrency slot, the
// rate-limit tokens and a budget reservation sized for the worst case. Every
// ticket must be settled exactly once with [Ticket.Settle] (or
// [Ticket.Release]), which swaps the reservation for the real usage. Because
// admission reserves the worst case under the tenant's lock, concurrent
// requests can never together bill a tenant past its budget.
//
// A budget is a lifetime total, or resets at the start of each calendar
// day, week or month in UTC (a tenant's budget period): a request counts in
// the period it was admitted in, as its ledger row's time does.
// [Gate.WatchBudgets] measures each budget's use and reports thresholds
// crossed (Config.OnBudgetAlert).
//
// Limiter state lives in this process's memory. Budget reservations do too
// on SQLite (one gateway per database; spend is seeded from the ledger when
// the Gate is created); on PostgreSQL, which several gateways may share,
// a tenant with a budget is reserved in the database (see book.go). Writing ledger rows is the
// caller's job. This package knows nothing of HTTP.
package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"

	"github.com/tailgate-dev/tailgate/data"
)

// Config configures a [Gate]. The zero value is usable.
type Config struct {
	// PollInterval is how often key and tenant changes made by other
	// processes are picked up. Zero means 250ms.
	PollInterval time.Duration
	// Prices maps a model name to its price. Models not listed cost
	// DefaultPrice.
	Prices map[string]Price
	// DefaultPrice prices models missing from Prices. The zero value makes
	// them free (and so never limited by a money budget).
	DefaultPrice Price
	// Now is the clock used by the rate limiters. Nil means time.Now.
	Now func() time.Time
	// CacheSize is the maximum number of keys (good or bad) kept in the
	// authentication cache. Zero means 100_000.
	CacheSize int64
	// OnBudgetAlert, when set, is told once per tenant, budget period and
	// threshold (the tenant's alert percent, and 100) when its budget's use
	// crosses it, as Run's budget watch measures it (every
	// BudgetWatchInterval); gateways sharing a database tell it once
	// between them. It is called from Run's goroutine and must not block.
	OnBudgetAlert func(BudgetAlert)
	// BudgetWatchInterval is how often Run measures the tenants' budget
	// use (tailgate_budget_used_ratio, alerts). Zero means 5s.
	BudgetWatchInterval time.Duration
}

// Defaults for the zero Config.
const (
	DefaultPollInterval = 250 * time.Millisecond
	// DefaultCacheSize: ristretto sizes its admission sketch and
	// doorkeeper by it (4.5 MB of heap at 100_000, whatever the cache
	// holds). At 10_000 an idle gateway's heap fell from 6.3 to 2.4 MB, but
	// CPU a JSON request at 1000 req/s rose 6 % (574 against 542 µs,
	// bench-ab.sh, 6 rounds; likely more GC cycles on a smaller heap) while
	// memory per open stream moved within noise, so it stays.
	DefaultCacheSize           = 100_000
	DefaultBudgetWatchInterval = 5 * time.Second
)

// Validate reports whether the configuration is usable.
func (c *Config) Validate() error {
	if c.PollInterval < 0 {
		return errors.New("negative poll interval")
	}
	if c.CacheSize < 0 {
		return errors.New("negative cache size")
	}
	if c.BudgetWatchInterval < 0 {
		return errors.New("negative budget watch interval")
	}
	if !c.DefaultPrice.valid() {
		return errors.New("negative default price")
	}
	for m, p := range c.Prices {
		if !p.valid() {
			return fmt.Errorf("negative price for model %q", m)
		}
	}
	return nil
}

// Gate authenticates and admits requests. Create it with [New], run
// [Gate.Run] in a goroutine you own, and call [Gate.Close] once nothing uses
// the Gate any more.
type Gate struct {
	st     *data.Store
	log    *slog.Logger
	now    func() time.Time
	poll   time.Duration
	prices map[string]Price
	defPr  Price
	// book books budget reservations: in memory, or in a database other
	// gateways share (then shared is the same book).
	book   book
	shared *sharedBook
	// gateways is how many gateways share the database (live leases,
	// counted at each renewal); each enforces 1/gateways of a key's rpm,
	// tpm and concurrency. 0 or 1: the whole limit.
	gateways atomic.Int64

	cache *ristretto.Cache[uint64, *entry]
	// gen invalidates every cache entry at once: an entry counts only if it
	// was looked up under the current generation, so a lookup that raced a
	// refresh cannot bring back what the refresh dropped.
	gen atomic.Uint64
	// version is the store's key version the cache reflects; owned by Run.
	version int64

	keysMu sync.Mutex
	keys   map[string]*keyState

	tenantsMu sync.RWMutex
	tenants   map[int64]*tenantState

	// reported are the money budget problems last logged; owned by Run.
	reported map[string]bool
	// onAlert and watchEvery: see Config.OnBudgetAlert and
	// Config.BudgetWatchInterval.
	onAlert    func(BudgetAlert)
	watchEvery time.Duration

	// unpricedNotes holds the tenant and model pairs noteUnpriced warned
	// about, unpricedCount how many.
	unpricedNotes sync.Map
	unpricedCount atomic.Int64

	closeOnce sync.Once
}

// New returns a Gate over st. It reads the store's key version, every
// tenant's budget and what the ledger says each tenant has spent.
func New(ctx context.Context, cfg Config, st *data.Store, log *slog.Logger) (*Gate, error) {
	if st == nil {
		return nil, errors.New("policy: nil store")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Gate{
		st:         st,
		log:        log,
		now:        cfg.Now,
		poll:       cfg.PollInterval,
		prices:     maps.Clone(cfg.Prices),
		defPr:      cfg.DefaultPrice,
		keys:       make(map[string]*keyState),
		tenants:    make(map[int64]*tenantState),
		onAlert:    cfg.OnBudgetAlert,
		watchEvery: cfg.BudgetWatchInterval,
	}
	if g.watchEvery == 0 {
		g.watchEvery = DefaultBudgetWatchInterval
	}
	if g.now == nil {
		g.now = time.Now
	}
	g.book = memoryBook{}
	if st.SharedBudgets() {
		g.shared = newSharedBook(st)
		g.book = g.shared
	}
	if g.poll == 0 {
		g.poll = DefaultPollInterval
	}
	size := cfg.CacheSize
	if size == 0 {
		size = DefaultCacheSize
	}
	cache, err := ristretto.NewCache(&ristretto.Config[uint64, *entry]{
		NumCounters:        10 * size,
		MaxCost:            size,
		BufferItems:        64,
		IgnoreInternalCost: true,
		// Never let a slow lookup overwrite a newer one's answer.
		ShouldUpdate: func(cur, prev *entry) bool { return cur.gen >= prev.gen },
	})
	if err != nil {
		return nil, fmt.Errorf("policy: key cache: %w", err)
	}
	g.cache = cache
	if err := g.init(ctx); err != nil {
		cache.Close()
		return nil, fmt.Errorf("policy: %w", err)
	}
	return g, nil
}

func (g *Gate) init(ctx context.Context) error {
	v, err := g.st.KeysVersion(ctx)
	if err != nil {
		return fmt.Errorf("keys version: %w", err)
	}
	g.version = v
	if err := g.loadBudgets(ctx); err != nil {
		return err
	}
	spend, err := g.st.TenantSpend(ctx)
	if err != nil {
		return fmt.Errorf("tenant spend: %w", err)
	}
	for id, s := range spend {
		if id == 0 {
			continue // ledger rows of requests rejected before a tenant was known
		}
		ts := g.tenantFor(id, "", 0, 0)
		ts.mu.Lock()
		ts.spent = s
		ts.mu.Unlock()
	}
	// What is wrong now is the caller's to report (see UnpricedBudgets);
	// Run reports what changes.
	return g.reportUnpriced(ctx, false)
}

// Run picks up key and budget changes made through the store (by this or
// another process) every PollInterval until ctx is done, then returns nil.
// Only one Run may be active per Gate. A failed poll is logged and retried
// at the next tick.
//
// On a database other gateways share, Run also renews this gateway's lease,
// reaps gateways whose lease ran out (settling their open rows, dropping
// their budget holds) and writes the releases of settled reservations.
func (g *Gate) Run(ctx context.Context) error {
	t := time.NewTicker(g.poll)
	defer t.Stop()
	watch := time.NewTicker(g.watchEvery)
	defer watch.Stop()
	var lease <-chan time.Time
	var wake chan struct{}
	if g.shared != nil {
		lt := time.NewTicker(data.LeaseRenewEvery)
		defer lt.Stop()
		lease, wake = lt.C, g.shared.wake
		g.renew(ctx, false)
	}
	for {
		select {
		case <-ctx.Done():
			if g.shared != nil {
				// What settled requests reserved beyond their cost goes
				// back before the gateway stops (bounded in time).
				g.shared.releaseIdle(true)
				fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reserveTimeout)
				_ = g.shared.flush(fctx)
				cancel()
			}
			return nil
		case <-t.C:
			if err := g.refresh(ctx); err != nil && ctx.Err() == nil {
				g.log.Warn("policy: refresh keys", "err", err)
			}
		case <-watch.C:
			if err := g.WatchBudgets(ctx); err != nil && ctx.Err() == nil {
				g.log.Warn("policy: measure budget use (retried)", "err", err)
			}
		case <-lease:
			g.renew(ctx, true)
			g.shared.releaseIdle(false)
			if err := g.shared.flush(ctx); err != nil && ctx.Err() == nil {
				g.log.Warn("policy: release budget reservations (retried)", "err", err)
			}
		case <-wake:
			if err := g.shared.flush(ctx); err != nil && ctx.Err() == nil {
				g.log.Warn("policy: release budget reservations (retried)", "err", err)
			}
		}
	}
}

// renew renews this gateway's lease and reaps gateways whose lease ran out.
func (g *Gate) renew(ctx context.Context, running bool) {
	fresh, err := g.st.Renew(ctx)
	if err != nil {
		if ctx.Err() == nil {
			g.log.Warn("policy: renew gateway lease", "err", err)
		}
		return
	}
	if fresh && running {
		g.log.Warn("policy: this gateway's lease had run out and was taken anew; other gateways may have settled its open rows and dropped its budget holds",
			"gateway", g.st.Instance())
	}
	if live, err := g.st.LiveGateways(ctx); err == nil {
		if prev := g.gateways.Swap(int64(live)); prev != int64(live) && live > 1 {
			g.log.Info("policy: gateways sharing the database changed; each enforces its share of per-key rpm, tpm and concurrency",
				"gateways", live)
		}
	} else if ctx.Err() == nil {
		g.log.Warn("policy: count the gateways sharing the database", "err", err)
	}
	n, rows, err := g.st.ReapGateways(ctx)
	switch {
	case err != nil && ctx.Err() == nil:
		g.log.Warn("policy: reap gateways whose lease ran out", "err", err)
	case n > 0 || rows > 0:
		g.log.Warn("policy: settled what stopped gateways left behind (lease ran out)", "gateways", n, "interrupted_rows", rows)
	}
	if g.shared != nil {
		if err := g.shared.flush(ctx); err != nil && ctx.Err() == nil {
			g.log.Warn("policy: release budget reservations (retried)", "err", err)
		}
	}
}

// refresh drops the key cache and reloads budgets if the store's key
// version moved. The version is recorded only after a complete reload, so a
// failed reload is retried at the next poll.
func (g *Gate) refresh(ctx context.Context) error {
	v, err := g.st.KeysVersion(ctx)
	if err != nil {
		return fmt.Errorf("keys version: %w", err)
	}
	if v == g.version {
		return nil
	}
	g.gen.Add(1)
	g.cache.Clear()
	if err := g.loadBudgets(ctx); err != nil {
		return err
	}
	g.version = v
	return g.reportUnpriced(ctx, true)
}

func (g *Gate) loadBudgets(ctx context.Context) error {
	ts, err := g.st.Tenants(ctx)
	if err != nil {
		return fmt.Errorf("tenants: %w", err)
	}
	now := g.now()
	for _, t := range ts {
		s := g.tenantFor(t.ID, t.Name, t.BudgetTokens, t.BudgetMicros)
		s.mu.Lock()
		s.name = t.Name
		s.budgetTokens, s.budgetMicros = t.BudgetTokens, t.BudgetMicros
		s.alertPercent = t.BudgetAlertPercent
		s.mu.Unlock()
		if err := g.syncPeriod(ctx, s, t.ID, t.BudgetPeriod, now); err != nil {
			return err
		}
	}
	return nil
}

// syncPeriod gives ts the budget period its tenant has in the database, if
// it has another: the period's spend so far is read from the ledger's daily
// totals (requests settled while it is read and not yet written may be
// missed, once).
func (g *Gate) syncPeriod(ctx context.Context, ts *tenantState, id int64, period string, now time.Time) error {
	ts.mu.Lock()
	same := ts.period == period
	ts.mu.Unlock()
	if same {
		return nil
	}
	start := data.PeriodStart(period, now)
	var sp data.Spend
	if period != "" {
		var err error
		if sp, err = g.st.TenantPeriodSpend(ctx, id, start); err != nil {
			return err
		}
	}
	ts.mu.Lock()
	ts.period, ts.start, ts.end = period, start, data.PeriodEnd(period, now)
	ts.periodSpent = sp
	ts.mu.Unlock()
	return nil
}

// Close stops the key cache's goroutines. Call it after Run has returned
// and no request uses the Gate any more; it is safe to call twice.
func (g *Gate) Close() error {
	g.closeOnce.Do(g.cache.Close)
	return nil
}

// keyFor returns the limiter state of a key, creating it on first use.
func (g *Gate) keyFor(id string) *keyState {
	g.keysMu.Lock()
	defer g.keysMu.Unlock()
	ks := g.keys[id]
	if ks == nil {
		ks = new(keyState)
		g.keys[id] = ks
	}
	return ks
}

// tenantFor returns the budget state of a tenant, creating it with the
// given name and budgets on first use.
func (g *Gate) tenantFor(id int64, name string, budgetTokens, budgetMicros int64) *tenantState {
	g.tenantsMu.RLock()
	ts := g.tenants[id]
	g.tenantsMu.RUnlock()
	if ts != nil {
		return ts
	}
	g.tenantsMu.Lock()
	defer g.tenantsMu.Unlock()
	if ts = g.tenants[id]; ts == nil {
		ts = &tenantState{name: name, budgetTokens: budgetTokens, budgetMicros: budgetMicros}
		g.tenants[id] = ts
	}
	return ts
}

// TenantState reports what a tenant has spent (the ledger's total when the
// Gate was created plus everything settled since) and what admitted,
// unsettled requests have reserved.
func (g *Gate) TenantState(tenantID int64) (spent, reserved data.Spend) {
	g.tenantsMu.RLock()
	ts := g.tenants[tenantID]
	g.tenantsMu.RUnlock()
	if ts == nil {
		return data.Spend{}, data.Spend{}
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.spent, ts.reserved
}
