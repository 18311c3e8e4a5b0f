// Package data owns tailgate's database, SQLite or PostgreSQL: schema,
// embedded numbered migrations, queries, and the batched ledger writer. It
// is the only package that imports the database drivers (modernc.org/sqlite,
// pure Go, no cgo; and pgx).
//
// # Overview
//
// [Open] opens (or creates) the database — a SQLite file in WAL mode with a
// busy timeout, so the gateway and the `tailgate keys`/`tailgate usage`
// commands can use the same file at once, or a postgres:// URL
// ([IsPostgres]) that several gateways share — and returns the [Store],
// through which every query goes: keys ([Store.Keys]), tenants and their
// spend, workers' credentials, batches and their files, usage
// ([Store.Usage]). Keys are stored only as a SHA-256 hash plus a short
// display prefix; generating and hashing secrets is policy's job.
//
// The ledger holds one row per request. Rows are written by one
// [LedgerWriter] goroutine in batches; closing it drains every row it was
// given, so a clean stop never loses a completed request. [LedgerWriter.Commit]
// waits until a row's transaction committed (rows of concurrent requests
// share it), so an answer can be billed before its last bytes leave; a
// stream in progress has an open row ([LedgerWriter.Open]) that its final
// row replaces, and that [Store.SettleOpen] settles as interrupted after a
// crash. Tenant spend counts each row once, when it is final.
// [LedgerWriter.Healthy] says whether rows are being persisted, so that the
// gateway can refuse work it could not bill (fail closed).
//
// With a commit log ([LedgerWriter.OpenCommitLog], SQLite only) Commit
// returns once its row is appended to a file beside the database
// (package data/commitlog); the next start writes what a dead writer only
// logged.
//
// [Store.Backup] takes a consistent copy of the database while it is in use;
// [Restore] puts one back while no gateway runs on the database.
//
// This package knows nothing of HTTP.
package data

import (
	"errors"
	"time"
)

// Errors returned by the Store.
var (
	// ErrNotFound: no row matched.
	ErrNotFound = errors.New("not found")
	// ErrAmbiguous: a reference (such as a key prefix) matched more than one row.
	ErrAmbiguous = errors.New("ambiguous reference")
	// ErrRevoked: the key is revoked, so it cannot be changed.
	ErrRevoked = errors.New("key is revoked")
)

// Tenant owns keys and a budget.
type Tenant struct {
	ID   int64
	Name string
	// BudgetTokens is the total prompt+completion tokens the tenant may use;
	// 0 means unlimited.
	BudgetTokens int64
	// BudgetMicros is the total cost (micro-units of currency) the tenant may
	// spend; 0 means unlimited.
	BudgetMicros int64
	// BudgetPeriod is when the budget resets: "" never (a lifetime total),
	// or at the start of each calendar "daily", "weekly" (Monday) or
	// "monthly" period in UTC (see [PeriodStart]).
	BudgetPeriod string
	// BudgetAlertPercent is the soft threshold: the share of the budget
	// (1–100) past which the gateway warns (a metric, a webhook).
	BudgetAlertPercent int64
	CreatedAt          time.Time
}

// Key is an API key as stored: never the secret itself.
type Key struct {
	ID     string // stable id, "key_" + 16 hex chars
	Tenant Tenant // the owning tenant (filled by queries that return keys)
	// Prefix is the display prefix of the secret (e.g. "tg-3f9a1c2b"), safe
	// to show and log.
	Prefix string
	Hash   []byte // SHA-256 of the secret, 32 bytes
	// Limits; 0 means unlimited.
	RPM            int64
	TPM            int64
	MaxConcurrency int64
	// Models the key may use; empty means all.
	Models    []string
	CreatedAt time.Time
	RevokedAt time.Time // zero while the key is active
	ExpiresAt time.Time // zero for a key that never expires
	// Class is the key's priority class, the highest its requests may run
	// as: "interactive", "standard" or "batch" (package policy reads it;
	// "" is stored as standard).
	Class string
	// Name (unique among the tenant's active keys; "" for none), Owner and
	// Note say whose key it is and what for.
	Name, Owner, Note string
	// LastUsedAt is the time of the key's newest request in the ledger, to
	// within a minute (zero: never used).
	LastUsedAt time.Time
	// PrevUntil is when the secret the key had before its last rotation
	// stops working (zero: no rotation, or none since it stopped).
	PrevUntil time.Time
	// Rotated is set on a key found by its previous secret
	// ([Store.KeyByHash]): that secret works only until PrevUntil.
	Rotated bool
}

// Revoked reports whether the key has been revoked.
func (k Key) Revoked() bool { return !k.RevokedAt.IsZero() }

// ExpiredAt reports whether the key has expired by t.
func (k Key) ExpiredAt(t time.Time) bool { return !k.ExpiresAt.IsZero() && !t.Before(k.ExpiresAt) }

// Stages are the per-request stage durations named in DESIGN.md. A negative
// value means "unknown / not measured" and is stored as NULL.
type Stages struct {
	Gateway      time.Duration // auth + admission + routing, before the first upstream byte
	Connect      time.Duration
	UpstreamTTFT time.Duration // gateway starts writing the request (connection in hand) → first token
	EngineQueue  time.Duration
	EngineTTFT   time.Duration
	Network      time.Duration // UpstreamTTFT minus the engine-reported part
	TTFT         time.Duration // client-visible
	Total        time.Duration
	// Hold is how long the request waited for a replica of its model to
	// become ready (a cold start); never billed, and outside the time to
	// first token the TTFT deadline bounds.
	Hold time.Duration
}

// UnknownStages returns Stages with every duration unknown (-1).
func UnknownStages() Stages {
	return Stages{-1, -1, -1, -1, -1, -1, -1, -1, -1}
}

// LedgerRow is one request as billed and timed.
type LedgerRow struct {
	ID       string // request id (also sent as x-request-id)
	Time     time.Time
	TenantID int64
	Tenant   string // filled on reads
	KeyID    string
	Model    string
	Upstream string // replica id or URL that served the request ("" if none)
	Stream   bool
	// Endpoint is the public path the request came in on, e.g.
	// /v1/chat/completions ("" if not recorded). It is written, and
	// exported with usage events, but not read back into LedgerRow.
	Endpoint string

	PromptTokens        int64
	CompletionTokens    int64
	HedgeOverheadTokens int64 // tokens burned by losing hedges; not billed
	CostMicros          int64

	Status  int        // HTTP status sent to the client (200 even for a mid-stream failure)
	Outcome Outcome    // how it ended: one of the Outcome constants
	Error   ErrorClass // short failure class, "" on success; never a key or a prompt

	Attempts int
	Hedged   bool
	Stages   Stages
	// AttemptLog is every attempt of the request, the winner and the
	// others, in the order they started. It is stored with a final row (not
	// with an open one) and filled by [Store.FindRequests].
	AttemptLog []Attempt

	// Priority is the class the request ran as ("" if it was refused before
	// that was known) and QueueWait how long it waited in the admission
	// queue (negative: it did not reach the queue).
	Priority  string
	QueueWait time.Duration

	// ReplayOf is the id of the request whose answer this one was given
	// again (an Idempotency-Key replay or a stream resumed: billed 0), or
	// which it ran again after the gateway running it died (billed only
	// what that one was not); "" for every other row.
	ReplayOf string
}

// UsageFilter selects ledger rows for [Store.Usage]. Zero fields do not filter.
type UsageFilter struct {
	Tenant string
	Since  time.Time // inclusive
	Until  time.Time // exclusive
	// By groups the totals: "" by (tenant, key, model); UsageByDay,
	// UsageByWeek or UsageByMonth by calendar period in UTC; UsageByTenant,
	// UsageByKey or UsageByModel by that alone.
	By string
}

// UsageRow is a usage total for one group of [UsageFilter.By]: the fields
// that do not group it are empty. Requests, the token counts and the cost
// count only requests that were not refused; Rejected counts the refused
// ones apart (see [Outcome.Rejected]).
type UsageRow struct {
	// Period is the start of the day, week (Monday) or month in UTC when
	// grouped by one; zero otherwise.
	Period           time.Time
	Tenant           string
	KeyID            string
	KeyPrefix        string
	KeyName          string
	Model            string
	Requests         int64
	PromptTokens     int64
	CompletionTokens int64
	CostMicros       int64
	Rejected         int64
}

// Spend is what a tenant has used so far according to the ledger.
type Spend struct {
	Tokens int64
	Micros int64
}
