package gateway

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/mesh"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/batch"
	"github.com/tailgate-dev/tailgate/server/slo"
	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/hop"
	"github.com/tailgate-dev/tailgate/serving/tracing"
)

// Config is the gateway's configuration (`gateway` and `up`) in one
// typed value: the flags, then the YAML file named by --config, checked by
// Validate and turned into each package's Config when the gateway opens.
//
// The file holds the fields with a yaml tag: database, upstreams,
// default_max_tokens and the per-model catalog. A flag given on the command line wins over the
// file; --upstream and --price add to it.
//
// Zero values. A zero number or duration, given as a flag or in the file,
// means the default (the value the flag's help shows); it never turns a
// feature off. Features are turned on or off by a bool: --hedge (on unless
// --hedge=false; per model hedge.enabled), --affinity (a mode: off, prefix, session), --mesh. Two durations are the
// exception, because zero is their natural "none": --slow-start 0 turns the
// ramp-up off and --shutdown-grace 0 stops without waiting for in-flight
// requests. In a model's entry every zero field inherits the gateway-wide
// setting, and a model without a price is free.
type Config struct {
	DataDir       string        `yaml:"-"`        // --data
	Database      string        `yaml:"database"` // --database; "": SQLite in DataDir
	Listen        string        `yaml:"-"`        // --listen
	AdminListen   string        `yaml:"-"`        // --admin-listen
	ConfigFile    string        `yaml:"-"`        // --config
	ShutdownGrace time.Duration `yaml:"-"`        // --shutdown-grace; 0: none
	Region        string        `yaml:"-"`        // --region: the name edges see in serving.RegionStatusPath
	DrainNotice   time.Duration `yaml:"-"`        // --drain-notice; 0: none

	// --batch-files-dir; "": DataDir/files. Gateways sharing one PostgreSQL
	// database share it too (a network file system), since any of them may
	// run a batch uploaded through another.
	BatchFilesDir string `yaml:"-"`

	Upstreams        []UpstreamConfig       `yaml:"upstreams"`          // the file's, then --upstream
	DefaultMaxTokens int64                  `yaml:"default_max_tokens"` // --default-max-tokens; 0: 1024
	Models           map[string]ModelConfig `yaml:"models"`             // the catalog; --price adds prices

	MaxBodyInFlight  int64 `yaml:"-"` // --max-body-bytes-in-flight; 0: 256 MiB
	MaxBodyPerTenant int64 `yaml:"-"` // --max-body-bytes-per-tenant; 0: a quarter of it
	HoldPerTenant    int   `yaml:"-"` // --hold-queue-per-tenant; 0: a quarter of --hold-queue
	AdmitPerTenant   int   `yaml:"-"` // --admit-queue-per-tenant; 0: a quarter of --admit-queue

	// --trusted-proxy: proxies whose X-Forwarded-For names the client;
	// --trust-trace-from: clients whose traceparent is continued.
	TrustedProxies []netip.Prefix `yaml:"-"`
	TraceFrom      []netip.Prefix `yaml:"-"`

	MaxBody   int64         `yaml:"-"` // --max-body; 0: 4 MiB
	KeepAlive time.Duration `yaml:"-"` // --sse-keepalive; 0: 10s
	// --hold-queue, --hold-timeout, --hold-progress: requests held through
	// a cold start (see server.HoldConfig).
	HoldQueue    int           `yaml:"-"`
	HoldTimeout  time.Duration `yaml:"-"`
	HoldProgress time.Duration `yaml:"-"`
	TTFTDeadline time.Duration `yaml:"-"` // --ttft-deadline; 0: 30s
	IdleDeadline time.Duration `yaml:"-"` // --idle-deadline; 0: 30s
	JSONDeadline time.Duration `yaml:"-"` // --json-deadline; 0: 10m
	// --idempotency-retention, --idempotency-max-bytes,
	// --idempotency-max-keys, --idempotency-abandon (server.Config's
	// Idempotency* fields).
	IdemRetention time.Duration `yaml:"-"`
	IdemMaxBytes  int64         `yaml:"-"`
	IdemMaxKeys   int           `yaml:"-"`
	IdemAbandon   time.Duration `yaml:"-"`

	ClientWriteTimeout time.Duration `yaml:"-"` // --client-write-timeout; 0: 30s
	MaxJSONDepth       int           `yaml:"-"` // --max-json-depth; 0: 64
	MediaPartTokens    int64         `yaml:"-"` // --media-part-tokens; 0: 16384
	RejectedRows       float64       `yaml:"-"` // --rejected-rows; 0: 20 per second

	AdmitCapacity  int64         `yaml:"-"` // --admit-capacity; 0: learnt engine slots
	AdmitHeadroom  int64         `yaml:"-"` // --admit-headroom; 0: capacity/8, -1: none
	AdmitQueue     int           `yaml:"-"` // --admit-queue; 0: 256
	AdmitWait      time.Duration `yaml:"-"` // --admit-wait; 0: 30s
	MaxConnections int           `yaml:"-"` // --max-connections; 0: 4096
	MaxConnsPerIP  int           `yaml:"-"` // --max-connections-per-address; 0: 1/8 of --max-connections
	AdminMaxConns  int           `yaml:"-"` // --admin-max-connections; 0: 256

	// The Batch API's limits (batch.Config); zero means its default.
	Batch batch.Config `yaml:"-"`

	UpstreamClient   string          `yaml:"-"` // --upstream-client; "": hop
	Policy           string          `yaml:"-"` // --policy; "": p2c
	Affinity         router.Affinity `yaml:"-"` // --affinity; session unless given
	AffinitySessions int             `yaml:"-"` // --affinity-sessions; 0: router.DefaultSessions
	AffinityBound    float64         `yaml:"-"` // --affinity-load-bound; 0: router.DefaultLoadBound
	AffinitySlack    int             `yaml:"-"` // --affinity-load-slack; 0: none
	SlowStart        time.Duration   `yaml:"-"` // --slow-start; 0: off
	RetryBudget      float64         `yaml:"-"` // --retry-budget; 0: 0.05
	Hedge            bool            `yaml:"-"` // --hedge; on unless --hedge=false
	HedgeBudget      float64         `yaml:"-"` // --hedge-budget; 0: 0.10
	HedgeBurst       float64         `yaml:"-"` // --hedge-burst; 0: 20
	HedgePercentile  float64         `yaml:"-"` // --hedge-percentile; 0: 0.95
	HedgeMin         time.Duration   `yaml:"-"` // --hedge-min; 0: 20ms
	HedgeMax         time.Duration   `yaml:"-"` // --hedge-max; 0: 30s

	TLS TLSConfig `yaml:"-"` // the public listener's: --tls-* and --acme-*

	Mesh           mesh.Flags `yaml:"-"` // gateway only: --mesh and --mesh-*
	MeshAllowPeers string     `yaml:"-"` // gateway only: --mesh-allow-peers
	MeshTLS        bool       `yaml:"-"` // gateway only: --mesh-tls
	MeshFunnel     bool       `yaml:"-"` // gateway only: --mesh-funnel

	OpenRegistration bool `yaml:"-"` // --open-registration

	Tracing tracing.Config `yaml:"-"` // --otlp-endpoint, --otlp-sample-ratio

	ForgetLost time.Duration `yaml:"-"` // --forget-lost; 0: 24h

	BudgetWebhook string `yaml:"-"` // --budget-webhook; "": none
	EdgeTokenFile string `yaml:"-"` // --edge-token-file; "": DIR/edge.token

	UsageWebhook string `yaml:"-"` // --usage-webhook; "": none
	// UsageWebhookPoll is how often the usage webhook looks for new events
	// (--usage-webhook-poll; 0: 1 s) and UsageWebhookBackoff its first wait
	// after a failed POST (0: 1 s, doubled up to a minute).
	UsageWebhookPoll    time.Duration `yaml:"-"`
	UsageWebhookBackoff time.Duration `yaml:"-"`

	// Latency budgets and request sources (config_slo.go).
	sloConfig `yaml:",inline"`

	Fleet FleetConfig `yaml:"fleet"` // the fleet controller (config_fleet.go)

	// BuildInfo is the tailgate_build_info gauge of the binary, registered
	// beside the gateway's metrics; nil: none.
	BuildInfo prometheus.Collector `yaml:"-"`

	upstreamFlags []string // --upstream, added to Upstreams by Load
	priceFlags    []string // --price, put in the catalog by Load
}

// UpstreamConfig is a static upstream (upstreams[i] in the file).
type UpstreamConfig struct {
	ID  string `yaml:"id"` // "": the URL's host:port
	URL string `yaml:"url"`

	fromFlag bool // from --upstream, not the file (for error messages)
}

// ModelConfig is one model's entry in the catalog, models.NAME in the file.
// A zero field inherits the gateway-wide setting.
type ModelConfig struct {
	MaxTokens    int64         `yaml:"max_tokens"`    // 0: default_max_tokens
	TTFTDeadline time.Duration `yaml:"ttft_deadline"` // 0: --ttft-deadline
	IdleDeadline time.Duration `yaml:"idle_deadline"` // 0: --idle-deadline
	Price        *PriceConfig  `yaml:"price"`         // nil: free; --price MODEL=IN,OUT replaces it
	Hedge        *ModelHedge   `yaml:"hedge"`         // nil: the --hedge* flags
	SLO          *slo.Budgets  `yaml:"slo"`           // nil: the default budgets; a stage given replaces the default's
	// AdmitCapacity is how many of the model's requests run at once before
	// lower priority classes wait; 0: --admit-capacity.
	AdmitCapacity int64 `yaml:"admit_capacity"`
}

// PriceConfig is a model's price in currency units per million tokens.
type PriceConfig struct {
	Input  float64 `yaml:"input_per_million"`
	Output float64 `yaml:"output_per_million"`
}

// ModelHedge overrides hedging for one model; zero fields inherit the
// --hedge-* flags.
type ModelHedge struct {
	Enabled    *bool         `yaml:"enabled"` // nil: --hedge
	Percentile float64       `yaml:"percentile"`
	Min        time.Duration `yaml:"min"`
	Max        time.Duration `yaml:"max"`
	Budget     float64       `yaml:"budget"` // 0: --hedge-budget
	Burst      float64       `yaml:"burst"`  // 0: --hedge-burst
}

// RegisterFlags defines the gateway's flags (those `up` shares) with their
// defaults on fs; Load completes c once fs is parsed. The flags and the
// config file are the two faces of Config, so they are defined beside it.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.DataDir, "data", "tailgate-data", "data directory: SQLite database, tokens, keys")
	fs.StringVar(&c.Database, "database", "", "where the gateway stores keys, budgets, the ledger and batches: a postgres://USER:PASSWORD@HOST/DB URL (the database must exist), or empty for SQLite in --data (DIR/tailgate.db)")
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:8080", "public (OpenAI-compatible) listen address")
	fs.StringVar(&c.AdminListen, "admin-listen", "127.0.0.1:8081", "admin listen address (metrics, admin API, dashboard)")
	fs.StringVar(&c.BudgetWebhook, "budget-webhook", "", "POST a signed JSON alert to this URL when a tenant's budget use crosses its alert percent or 100%, once per tenant, period and threshold (X-Tailgate-Signature: HMAC-SHA256 under DIR/webhook.secret, made on first use)")
	fs.StringVar(&c.UsageWebhook, "usage-webhook", "", "POST every usage event (a final ledger row, CloudEvents JSON with a stable id) to this URL, signed like --budget-webhook, in order and at least once: failed POSTs are retried with backoff and the cursor is kept in the database across restarts")
	fs.DurationVar(&c.UsageWebhookPoll, "usage-webhook-poll", time.Second, "how often --usage-webhook looks for new events")
	fs.BoolVar(&c.OpenRegistration, "open-registration", false, "let a worker holding the cluster token alone register a new replica id (off: it needs tailgate workers invite or tailgate workers approve); a revoked id stays out either way")
	fs.Func("upstream", "static OpenAI-compatible upstream: its root or base URL, e.g. http://10.0.0.5:8000 or http://10.0.0.5:8000/v1 (repeatable)", appendTo(&c.upstreamFlags))
	fs.StringVar(&c.ConfigFile, "config", "", "YAML config file (upstreams, per-model max_tokens, prices, deadlines, hedging); flags given here win over it, --upstream and --price add to it")
	fs.Int64Var(&c.DefaultMaxTokens, "default-max-tokens", 1024, "max_tokens applied when a request sets none")
	fs.Int64Var(&c.MaxBody, "max-body", 4<<20, "largest request body in bytes (larger: 413)")
	fs.Int64Var(&c.MaxBodyInFlight, "max-body-bytes-in-flight", 256<<20, "request-body bytes held at once over all requests; past it a request waits up to 2s, then gets 503 (0: 256 MiB)")
	fs.Int64Var(&c.MaxBodyPerTenant, "max-body-bytes-per-tenant", 0, "one tenant's share of --max-body-bytes-in-flight; past it its requests get 429 while other tenants' still fit (0: a quarter, at least two of the largest body)")
	fs.IntVar(&c.HoldPerTenant, "hold-queue-per-tenant", 0, "one tenant's share of each model's --hold-queue; past it its requests get 429 queue_full while other tenants' are still held (0: a quarter of --hold-queue)")
	fs.IntVar(&c.AdmitPerTenant, "admit-queue-per-tenant", 0, "one tenant's share of each --admit-queue (per class and model); past it its requests get 429 queue_full while other tenants' still queue (0: a quarter of --admit-queue)")
	fs.Func("trusted-proxy", "a proxy network (CIDR, e.g. 10.0.0.0/8, or one address) whose X-Forwarded-For names the client: its connections count against --max-connections only, and each client it forwards gets its own --max-connections-per-address share (repeatable, or comma-separated)", prefixesTo(&c.TrustedProxies))
	fs.Func("trust-trace-from", "a client network (CIDR or one address) whose traceparent the gateway continues; from anywhere else a request starts its own trace, sampled by --otlp-sample-ratio (repeatable, or comma-separated)", prefixesTo(&c.TraceFrom))
	fs.DurationVar(&c.KeepAlive, "sse-keepalive", 10*time.Second, "send an SSE comment when a stream is silent this long")
	fs.IntVar(&c.HoldQueue, "hold-queue", server.DefaultHold.Queue, "requests held per model while no replica of it is ready but one is starting or can be started; past it 429 queue_full (-1: hold nothing, 503 no_replica at once)")
	fs.DurationVar(&c.HoldTimeout, "hold-timeout", server.DefaultHold.Timeout, "how long a request is held for a replica of its model to become ready; past it 503 no_replica with Retry-After")
	fs.DurationVar(&c.HoldProgress, "hold-progress", server.DefaultHold.Progress, "how often a held stream gets an SSE comment saying what it waits for")
	fs.Func("price", "price of a model as MODEL=INPUT,OUTPUT per million tokens, e.g. llama=0.2,0.6 (repeatable)", appendTo(&c.priceFlags))
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", 30*time.Second, "on SIGTERM, how long in-flight requests may finish (0: none)")
	fs.StringVar(&c.Region, "region", "", "this gateway's region name, as edges (tailgate edge, the Cloudflare Worker) read it at GET "+serving.RegionStatusPath)
	fs.StringVar(&c.EdgeTokenFile, "edge-token-file", "", "file holding the token edges send to read GET "+serving.RegionStatusPath+" (made, mode 0600, if missing; \"\": DIR/edge.token); point every region at the same token")
	fs.DurationVar(&c.DrainNotice, "drain-notice", 0, "on SIGTERM, how long the gateway keeps taking requests while "+serving.RegionStatusPath+" says draining, so edges move new traffic first (e.g. 3s with edges polling every second; 0: none)")
	fs.StringVar(&c.UpstreamClient, "upstream-client", string(hop.Hop), "HTTP client to replicas: hop (tailgate's own HTTP/1.1 client, less CPU per request) or nethttp (Go's net/http, the way back)")
	fs.StringVar(&c.Policy, "policy", "p2c", "replica selection: p2c (load and latency aware) or round-robin (baseline)")
	c.Affinity = router.AffinitySession
	fs.Var((*affinityFlag)(&c.Affinity), "affinity", "keep related requests on one replica, whose engine has their prefix cached: --affinity=off, prefix (same prompt prefix when load is comparable) or session (a conversation's turns, named by x-session-affinity, prompt_cache_key, user or metadata.user_id, within the load bound; the rest by load); a bare --affinity means "+router.DefaultAffinity.String())
	fs.IntVar(&c.AffinitySessions, "affinity-sessions", router.DefaultSessions, "--affinity=session: recent sessions remembered (least recently used forgotten first)")
	fs.Float64Var(&c.AffinityBound, "affinity-load-bound", router.DefaultLoadBound, "--affinity=session: a session stays on its replica while that holds at most this factor of the mean requests in flight")
	fs.IntVar(&c.AffinitySlack, "affinity-load-slack", router.DefaultLoadSlack, "--affinity=session: a session also stays on its replica while that holds at most this many requests above the mean, for small fleets where a factor of the mean is less than one request (0: the factor alone)")
	fs.DurationVar(&c.SlowStart, "slow-start", router.DefaultSlowStart, "how long a freshly ready replica ramps up to a full share; its load counts double at first (0: off)")
	fs.DurationVar(&c.TTFTDeadline, "ttft-deadline", 30*time.Second, "an attempt with no first token by then is abandoned and its replica ejected")
	fs.DurationVar(&c.IdleDeadline, "idle-deadline", 30*time.Second, "a stream silent this long between tokens is cut and its replica ejected")
	fs.DurationVar(&c.JSONDeadline, "json-deadline", 10*time.Minute, "how long a request that is not streamed may wait for its answer")
	fs.DurationVar(&c.IdemRetention, "idempotency-retention", server.DefaultIdempotencyRetention, "how long the answer of a request sent with an Idempotency-Key is kept for its retries")
	fs.Int64Var(&c.IdemMaxBytes, "idempotency-max-bytes", server.DefaultIdempotencyMaxBytes, "largest answer kept for an Idempotency-Key's retries (a larger one is answered; its retries get 409)")
	fs.IntVar(&c.IdemMaxKeys, "idempotency-max-keys", server.DefaultIdempotencyMaxKeys, "most Idempotency-Key records a tenant keeps; its oldest beyond are removed every minute")
	fs.DurationVar(&c.IdemAbandon, "idempotency-abandon", server.DefaultIdempotencyAbandon, "how long a request sent with an Idempotency-Key runs on with no client reading its answer (a client that reconnects meanwhile resumes it)")
	fs.DurationVar(&c.ClientWriteTimeout, "client-write-timeout", 30*time.Second, "a client that does not read its answer for this long is cut, and what it held is released")
	fs.IntVar(&c.MaxJSONDepth, "max-json-depth", 64, "deepest nesting of objects and arrays in a request body (deeper: 400)")
	fs.Int64Var(&c.MediaPartTokens, "media-part-tokens", 16384, "prompt tokens reserved against the budget for each image, audio or video part of a chat message")
	fs.Float64Var(&c.RejectedRows, "rejected-rows", 20, "ledger rows per second for refused requests (bad input, limits); past it they are only counted in tailgate_ledger_rows_skipped_total")
	fs.Int64Var(&c.AdmitCapacity, "admit-capacity", 0, "generation requests per model that run at once before standard and batch requests wait in the admission queue, interactive ones a headroom later (0: the engine slots learnt from the model's ready replicas; nothing waits until those are known)")
	fs.Int64Var(&c.AdmitHeadroom, "admit-headroom", 0, "how far past --admit-capacity interactive requests are still admitted at once, and how far below it batch requests stop (0: an eighth of the capacity, -1: none)")
	fs.IntVar(&c.AdmitQueue, "admit-queue", policy.DefaultMaxQueue, "requests that may wait per priority class and model; more get 429 queue_full")
	fs.DurationVar(&c.AdmitWait, "admit-wait", policy.DefaultMaxWait, "longest wait in the admission queue; past it a request gets 408 queue_timeout")
	fs.IntVar(&c.MaxConnections, "max-connections", 4096, "most client connections the public listener holds open at once; at the cap the longest idle one is closed, and with none idle new ones wait to be accepted")
	fs.IntVar(&c.MaxConnsPerIP, "max-connections-per-address", 0, "most connections one client IP address (loopback too) holds open on a listener; one more is closed at once (0: 1/8 of the listener's cap)")
	fs.IntVar(&c.AdminMaxConns, "admin-max-connections", 256, "most connections the admin listener holds open at once, as --max-connections (its per-address share: 1/8 of it)")
	fs.StringVar(&c.BatchFilesDir, "batch-files-dir", "", "where Batch API file bodies are kept (default: DIR/files); gateways sharing one PostgreSQL database must share this directory too (e.g. NFS), since any of them may run a batch uploaded through another")
	fs.Int64Var(&c.Batch.MaxFileBytes, "batch-max-file-bytes", 100<<20, "largest batch input file upload (larger: 413)")
	fs.IntVar(&c.Batch.MaxFileLines, "batch-max-file-lines", 50000, "most requests (non-blank lines) in a batch input file")
	fs.Int64Var(&c.Batch.MaxLineBytes, "batch-max-line-bytes", 1<<20, "longest line of a batch input file")
	fs.IntVar(&c.Batch.Concurrency, "batch-concurrency", 32, "batch lines in flight across all batches")
	fs.IntVar(&c.Batch.TenantConcurrency, "batch-tenant-concurrency", 8, "batch lines in flight per tenant (a key's --max-concurrency, when lower, bounds its batches)")
	fs.Int64Var(&c.Batch.TenantStorageBytes, "batch-tenant-storage", 1<<30, "bytes of files one tenant may keep (uploads and results)")
	fs.DurationVar(&c.Batch.FileExpiry, "batch-file-expiry", 30*24*time.Hour, "files (inputs and results) are removed this long after they were made, unless the upload asks for less")
	fs.DurationVar(&c.Batch.BodyTimeout, "batch-body-timeout", 30*time.Second, "bound of reading a batch request body, and the first part of an upload")
	fs.Int64Var(&c.Batch.UploadMinRate, "batch-upload-min-rate", 64<<10, "slowest an upload may arrive after its first --batch-body-timeout, in bytes per second")
	fs.DurationVar(&c.Batch.UploadTimeout, "batch-upload-timeout", 10*time.Minute, "longest one upload may take")
	fs.BoolVar(&c.Hedge, "hedge", true, "hedge requests: a second attempt on another replica when the first has no token by the hedge delay (--hedge=false turns it off; a client opts a request out with x-tailgate-hedge: off)")
	fs.Float64Var(&c.HedgeBudget, "hedge-budget", 0.10, "hedges as a fraction of requests per model, between 0 and 1 (0: the default); their own budget, apart from --retry-budget")
	fs.Float64Var(&c.HedgeBurst, "hedge-burst", 20, "hedges that may start at once beyond their --hedge-budget share, per model (0: the default); parts of one x-tailgate-group may run one burst further on credit")
	fs.Float64Var(&c.HedgePercentile, "hedge-percentile", 0.95, "hedge delay: this percentile of recent time to first token, per model")
	fs.DurationVar(&c.HedgeMin, "hedge-min", 20*time.Millisecond, "smallest hedge delay")
	fs.DurationVar(&c.HedgeMax, "hedge-max", 30*time.Second, "largest hedge delay")
	fs.Float64Var(&c.RetryBudget, "retry-budget", 0.05, "retries after a request reached a replica, as a fraction of requests, between 0 and 1 (0: the default); hedges have --hedge-budget")
	c.TLS.register(fs)
	c.sloConfig.register(fs)
	c.Fleet.register(fs)
	c.Tracing.RegisterFlags(fs)
	fs.DurationVar(&c.ForgetLost, "forget-lost", router.DefaultForgetLost, "how long a registered worker's replica whose heartbeats stopped stays listed as lost (never routed to, tailgate_replica_ready 0, so alerts see it) before the gateway forgets it; an operator forgets one sooner with DELETE /admin/v1/replicas/ID (0: 24h)")
}

// RegisterMeshFlags defines the mesh flags, which `gateway` has and `up`
// has not.
func (c *Config) RegisterMeshFlags(fs *flag.FlagSet) {
	c.Mesh.Register(fs, "tg-gateway")
	fs.StringVar(&c.MeshAllowPeers, "mesh-allow-peers", "", "with --mesh: only tailnet peers with one of these tags or host names may register as workers (comma-separated), besides the cluster token")
	fs.BoolVar(&c.MeshTLS, "mesh-tls", false, "with --mesh: also serve the public API on the tailnet over HTTPS at port 443, with the node's Tailscale certificate (https://NODE.TAILNET.ts.net/v1); the tailnet must have HTTPS certificates enabled")
	fs.BoolVar(&c.MeshFunnel, "mesh-funnel", false, "with --mesh: also serve the public API (never the admin routes) on the internet through Tailscale Funnel at https://NODE.TAILNET.ts.net/v1, over the node's outbound connection (no inbound port); the tailnet must allow Funnel (the funnel node attribute) and HTTPS certificates")
}

// prefixesTo is a repeatable flag's setter of networks: CIDRs or single
// addresses, comma-separated.
func prefixesTo(list *[]netip.Prefix) func(string) error {
	return func(v string) error {
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			if f == "" {
				continue
			}
			p, err := netip.ParsePrefix(f)
			if err != nil {
				a, aerr := netip.ParseAddr(f)
				if aerr != nil {
					return fmt.Errorf("%q: want a network like 10.0.0.0/8 or an address", f)
				}
				p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
			}
			*list = append(*list, p.Masked())
		}
		return nil
	}
}

// appendTo is a repeatable flag's setter.
func appendTo(list *[]string) func(string) error {
	return func(v string) error { *list = append(*list, v); return nil }
}

// Load completes c once fs (with c's flags) is parsed and checks it: the
// --config file is read under the flags given on fs's command line, then
// --upstream and --price are added.
func (c *Config) Load(fs *flag.FlagSet) error {
	if err := c.load(fs); err != nil {
		return err
	}
	return c.Validate()
}

func (c *Config) load(fs *flag.FlagSet) error {
	if c.ConfigFile != "" {
		raw, err := os.ReadFile(c.ConfigFile)
		if err != nil {
			return fmt.Errorf("--config: %w", err)
		}
		flagMaxTokens, flagDatabase := c.DefaultMaxTokens, c.Database
		if err := decodeYAML(raw, c); err != nil {
			return fmt.Errorf("--config %s: %w", c.ConfigFile, err)
		}
		if flagGiven(fs, "default-max-tokens") {
			c.DefaultMaxTokens = flagMaxTokens
		}
		if flagGiven(fs, "database") {
			c.Database = flagDatabase
		}
	}
	for _, u := range c.upstreamFlags {
		c.Upstreams = append(c.Upstreams, UpstreamConfig{URL: u, fromFlag: true})
	}
	c.upstreamFlags = nil
	for _, p := range c.priceFlags {
		model, rest, ok := strings.Cut(p, "=")
		in, out, ok2 := strings.Cut(rest, ",")
		fin, err1 := strconv.ParseFloat(in, 64)
		fout, err2 := strconv.ParseFloat(out, 64)
		if !ok || !ok2 || model == "" || err1 != nil || err2 != nil || fin < 0 || fout < 0 {
			return fmt.Errorf("--price %q: want MODEL=INPUT,OUTPUT per million tokens, e.g. llama=0.2,0.6", p)
		}
		if c.Models == nil {
			c.Models = map[string]ModelConfig{}
		}
		m := c.Models[model]
		m.Price = &PriceConfig{Input: fin, Output: fout}
		c.Models[model] = m
	}
	c.priceFlags = nil
	c.Fleet.load()
	return c.sloConfig.load()
}

// flagGiven reports whether the flag name was set on fs's command line.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// Validate reports the first setting that cannot work, naming its flag or
// its key in the file.
func (c *Config) Validate() error {
	if c.BudgetWebhook != "" {
		if _, err := server.NewBudgetWebhook(server.BudgetWebhookConfig{URL: c.BudgetWebhook, Secret: []byte("x")}); err != nil {
			return fmt.Errorf("--budget-webhook: %w", err)
		}
	}
	if c.UsageWebhook != "" {
		if _, err := server.NewUsageSink(server.UsageSinkConfig{URL: c.UsageWebhook, Secret: []byte("x")}, nil); err != nil {
			return fmt.Errorf("--usage-webhook: %w", err)
		}
	}
	if c.UsageWebhookPoll < 0 {
		return fmt.Errorf("--usage-webhook-poll %s: want a positive duration", c.UsageWebhookPoll)
	}
	switch {
	case c.DataDir == "":
		return errors.New("--data: a data directory is required")
	case c.Database != "" && !data.IsPostgres(c.Database):
		return fmt.Errorf("--database (database) %q: want a postgres:// or postgresql:// URL, or nothing for SQLite in --data", data.Redact(c.Database))
	case c.DefaultMaxTokens < 0:
		return fmt.Errorf("--default-max-tokens (default_max_tokens) %d: want a positive count (0: 1024)", c.DefaultMaxTokens)
	case c.MaxJSONDepth < 0 || c.MaxJSONDepth > 10000:
		return fmt.Errorf("--max-json-depth %d: want 1 to 10000 (0: 64)", c.MaxJSONDepth)
	case c.MediaPartTokens < 0:
		return fmt.Errorf("--media-part-tokens %d: want a positive number of tokens (0: 16384)", c.MediaPartTokens)
	case c.MaxConnections < 0:
		return fmt.Errorf("--max-connections %d: want a positive count (0: 4096)", c.MaxConnections)
	case c.MaxBodyPerTenant < 0 || c.HoldPerTenant < 0 || c.AdmitPerTenant < 0:
		return errors.New("--max-body-bytes-per-tenant, --hold-queue-per-tenant and --admit-queue-per-tenant want a positive share (0: a quarter)")
	case c.MaxConnsPerIP < 0:
		return fmt.Errorf("--max-connections-per-address %d: want a positive count (0: 1/8 of --max-connections)", c.MaxConnsPerIP)
	case c.AdminMaxConns < 0:
		return fmt.Errorf("--admin-max-connections %d: want a positive count (0: 256)", c.AdminMaxConns)
	case c.RejectedRows < 0:
		return fmt.Errorf("--rejected-rows %v: want a positive rate per second (0: 20)", c.RejectedRows)
	case c.MaxBody < 0:
		return fmt.Errorf("--max-body %d: want a positive size in bytes (0: 4 MiB)", c.MaxBody)
	case c.AdmitCapacity < 0:
		return fmt.Errorf("--admit-capacity %d: want a number of requests (0: learnt from the engines)", c.AdmitCapacity)
	case c.AdmitQueue < 0:
		return fmt.Errorf("--admit-queue %d: want a number of requests (0: %d)", c.AdmitQueue, policy.DefaultMaxQueue)
	case c.MeshAllowPeers != "" && !c.Mesh.Enabled:
		return errors.New("--mesh-allow-peers needs --mesh")
	case c.MeshTLS && !c.Mesh.Enabled:
		return errors.New("--mesh-tls needs --mesh (it serves the API on the tailnet with the node's certificate)")
	case c.MeshFunnel && !c.Mesh.Enabled:
		return errors.New("--mesh-funnel needs --mesh (Funnel serves the API through the gateway's tailnet node; add --mesh and its --mesh-* flags)")
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"--shutdown-grace", c.ShutdownGrace}, {"--sse-keepalive", c.KeepAlive},
		{"--hold-timeout", c.HoldTimeout}, {"--hold-progress", c.HoldProgress},
		{"--ttft-deadline", c.TTFTDeadline}, {"--idle-deadline", c.IdleDeadline}, {"--json-deadline", c.JSONDeadline},
		{"--client-write-timeout", c.ClientWriteTimeout}, {"--admit-wait", c.AdmitWait},
		{"--forget-lost", c.ForgetLost}, {"--drain-notice", c.DrainNotice},
		{"--idempotency-retention", c.IdemRetention}, {"--idempotency-abandon", c.IdemAbandon},
	} {
		if d.v < 0 {
			return fmt.Errorf("%s %v: want a positive duration", d.flag, d.v)
		}
	}
	for _, a := range []struct{ flag, addr string }{{"--listen", c.Listen}, {"--admin-listen", c.AdminListen}} {
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			return fmt.Errorf("%s %q: want HOST:PORT, e.g. 127.0.0.1:8080", a.flag, a.addr)
		}
	}
	if _, err := hop.ParseClient(c.UpstreamClient); err != nil {
		return fmt.Errorf("--upstream-client: %w", err)
	}
	if _, err := router.ParsePolicy(c.Policy); err != nil {
		return fmt.Errorf("--policy: %w", err)
	}
	if err := c.TLS.Validate(); err != nil {
		return err
	}
	if err := c.Tracing.Validate(); err != nil {
		return err
	}
	if err := c.Fleet.validate(); err != nil {
		return err
	}
	// The router's rules, checked one setting at a time to name its flag.
	for _, r := range []struct {
		flag string
		v    any
		cfg  router.Config
	}{
		{"--slow-start", c.SlowStart, router.Config{SlowStart: c.SlowStart}},
		{"--retry-budget", c.RetryBudget, router.Config{Budget: router.BudgetConfig{Ratio: c.RetryBudget}}},
		{"--hedge-percentile", c.HedgePercentile, router.Config{Hedge: router.HedgeConfig{Percentile: c.HedgePercentile}}},
		{"--hedge-budget", c.HedgeBudget, router.Config{Hedge: router.HedgeConfig{Budget: c.HedgeBudget}}},
		{"--hedge-burst", c.HedgeBurst, router.Config{Hedge: router.HedgeConfig{Burst: c.HedgeBurst}}},
		{"--hedge-min, --hedge-max", []time.Duration{c.HedgeMin, c.HedgeMax}, router.Config{Hedge: router.HedgeConfig{Min: c.HedgeMin, Max: c.HedgeMax}}},
	} {
		if err := r.cfg.Validate(); err != nil {
			return fmt.Errorf("%s %v: %w", r.flag, r.v, err)
		}
	}
	for i, u := range c.Upstreams {
		if _, _, err := ParseUpstream(u.URL); err != nil {
			where := fmt.Sprintf("upstreams[%d].url", i)
			if u.fromFlag {
				where = "--upstream"
			}
			return fmt.Errorf("%s %q: %w", where, u.URL, err)
		}
	}
	for name, m := range c.Models {
		if name == "" {
			return errors.New("models: a model name is empty")
		}
		if err := m.Validate(); err != nil {
			return fmt.Errorf("models.%s.%w", name, err)
		}
	}
	return c.sloConfig.validate(c.Models)
}

// Validate reports the first setting of the entry that cannot work; the
// error starts with its key (e.g. "max_tokens: ...").
func (m ModelConfig) Validate() error {
	switch {
	case m.MaxTokens < 0:
		return fmt.Errorf("max_tokens: %d is negative (0 or absent: default_max_tokens)", m.MaxTokens)
	case m.TTFTDeadline < 0:
		return fmt.Errorf("ttft_deadline: %v is negative (0 or absent: --ttft-deadline)", m.TTFTDeadline)
	case m.IdleDeadline < 0:
		return fmt.Errorf("idle_deadline: %v is negative (0 or absent: --idle-deadline)", m.IdleDeadline)
	case m.Price != nil && (m.Price.Input < 0 || m.Price.Output < 0):
		return fmt.Errorf("price: %v input, %v output per million tokens: a price is not negative", m.Price.Input, m.Price.Output)
	}
	if h := m.Hedge; h != nil {
		if err := (router.Config{Hedge: router.HedgeConfig{Percentile: h.Percentile}}).Validate(); err != nil {
			return fmt.Errorf("hedge.percentile %v: %w", h.Percentile, err)
		}
		if err := (router.Config{Hedge: router.HedgeConfig{Min: h.Min, Max: h.Max}}).Validate(); err != nil {
			return fmt.Errorf("hedge.min, hedge.max %v, %v: %w", h.Min, h.Max, err)
		}
		if err := (router.Config{Hedge: router.HedgeConfig{Budget: h.Budget}}).Validate(); err != nil {
			return fmt.Errorf("hedge.budget %v: %w", h.Budget, err)
		}
		if err := (router.Config{Hedge: router.HedgeConfig{Burst: h.Burst}}).Validate(); err != nil {
			return fmt.Errorf("hedge.burst %v: %w", h.Burst, err)
		}
	}
	return nil
}

// upstream is a static upstream as the router gets it: an id and a base URL
// without a trailing /v1.
type upstream struct{ id, url string }

// ParseUpstream returns the base URL and the host of an upstream URL. The
// server's root (http://host:8000) and the base URL OpenAI clients take
// (http://host:8000/v1) name the same upstream; an endpoint does not.
func ParseUpstream(raw string) (base, host string, err error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", "", errors.New("want a base URL like http://host:8000 or http://host:8000/v1")
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", "", errors.New("want a base URL like http://host:8000/v1, without user, query or fragment")
	}
	p := strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/v1")
	if strings.Contains(p+"/", "/v1/") {
		return "", "", errors.New("want the server's base URL (http://host:8000 or http://host:8000/v1), not one of its endpoints")
	}
	u.Path, u.RawPath = p, ""
	return u.String(), u.Host, nil
}

// parts is a valid Config as each package's Config.
type parts struct {
	upstreams []upstream
	srvCfg    server.Config
	prices    map[string]policy.Price
	routerCfg router.Config
}

// setup turns a valid c into each package's Config.
func (c *Config) setup() (*parts, error) {
	st := &parts{
		srvCfg: server.Config{
			DefaultMaxTokens: c.DefaultMaxTokens, MaxBodyBytes: c.MaxBody, KeepAlive: c.KeepAlive,
			Hold:         server.HoldConfig{Queue: c.HoldQueue, PerTenant: c.HoldPerTenant, Timeout: c.HoldTimeout, Progress: c.HoldProgress},
			TTFTDeadline: c.TTFTDeadline, IdleDeadline: c.IdleDeadline, JSONDeadline: c.JSONDeadline,
			IdempotencyRetention: c.IdemRetention, IdempotencyMaxBytes: c.IdemMaxBytes, IdempotencyMaxKeys: c.IdemMaxKeys, IdempotencyAbandon: c.IdemAbandon,
			ClientWriteTimeout: c.ClientWriteTimeout, MaxJSONDepth: c.MaxJSONDepth, MediaPartTokens: c.MediaPartTokens,
			RejectedRows: c.RejectedRows, OpenRegistration: c.OpenRegistration, MaxBodyBytesInFlight: c.MaxBodyInFlight,
			MaxBodyBytesPerTenant: c.MaxBodyPerTenant, TrustedProxies: c.TrustedProxies, TraceFrom: c.TraceFrom,
			MaxTokensByModel: map[string]int64{}, TTFTDeadlineByModel: map[string]time.Duration{},
			IdleDeadlineByModel: map[string]time.Duration{},
			SLO:                 c.sloConfig.config(c.Models),
			AdmitCapacity:       c.AdmitCapacity, AdmitCapacityByModel: map[string]int64{},
			Admission: policy.QueueConfig{Headroom: c.AdmitHeadroom, MaxQueue: c.AdmitQueue, MaxQueuePerTenant: c.AdmitPerTenant, MaxWait: c.AdmitWait},
		},
		prices: map[string]policy.Price{},
	}
	for _, u := range c.Upstreams {
		base, host, err := ParseUpstream(u.URL)
		if err != nil {
			return nil, err
		}
		id := u.ID
		if id == "" {
			id = host
		}
		st.upstreams = append(st.upstreams, upstream{id: id, url: base})
	}
	for name, m := range c.Models {
		if m.MaxTokens > 0 {
			st.srvCfg.MaxTokensByModel[name] = m.MaxTokens
		}
		if m.AdmitCapacity > 0 {
			st.srvCfg.AdmitCapacityByModel[name] = m.AdmitCapacity
		}
		if m.TTFTDeadline > 0 {
			st.srvCfg.TTFTDeadlineByModel[name] = m.TTFTDeadline
		}
		if m.IdleDeadline > 0 {
			st.srvCfg.IdleDeadlineByModel[name] = m.IdleDeadline
		}
		if p := m.Price; p != nil {
			st.prices[name] = policy.Price{InputMicrosPerM: policy.Micros(p.Input), OutputMicrosPerM: policy.Micros(p.Output)}
		}
	}
	var err error
	if st.routerCfg, err = c.routerConfig(); err != nil {
		return nil, err
	}
	return st, nil
}

// affinityFlag is --affinity: a mode, or bare (a bool flag) the default mode.
type affinityFlag router.Affinity

func (f *affinityFlag) String() string {
	if f == nil {
		return router.AffinityOff.String()
	}
	return router.Affinity(*f).String()
}

func (f *affinityFlag) Set(s string) error {
	a, err := router.ParseAffinity(s)
	if err != nil {
		return fmt.Errorf("want --affinity=off, --affinity=prefix or --affinity=session (a bare --affinity means %s)", router.DefaultAffinity)
	}
	*f = affinityFlag(a)
	return nil
}

func (f *affinityFlag) IsBoolFlag() bool { return true }

// routerConfig is the router's part of c, the one place that knows how the
// flags map onto router.Config.
func (c *Config) routerConfig() (router.Config, error) {
	sel, err := router.ParsePolicy(c.Policy)
	if err != nil {
		return router.Config{}, fmt.Errorf("--policy: %w", err)
	}
	if c.AffinitySlack < 0 {
		return router.Config{}, fmt.Errorf("--affinity-load-slack %d: must not be negative (0: the load bound's factor alone)", c.AffinitySlack)
	}
	slack := c.AffinitySlack
	if slack == 0 {
		slack = -1 // the router's 0 is its default
	}
	rc := router.Config{
		Selector: sel, Affinity: c.Affinity, Sessions: c.AffinitySessions, LoadBound: c.AffinityBound, LoadSlack: slack, SlowStart: c.SlowStart, ForgetLost: c.ForgetLost,
		Budget: router.BudgetConfig{Ratio: c.RetryBudget},
		Hedge: router.HedgeConfig{Enabled: c.Hedge, Percentile: c.HedgePercentile, Min: c.HedgeMin, Max: c.HedgeMax,
			Budget: c.HedgeBudget, Burst: c.HedgeBurst, Models: map[string]router.HedgeModel{}},
	}
	for name, m := range c.Models {
		if h := m.Hedge; h != nil {
			rc.Hedge.Models[name] = router.HedgeModel{Enabled: h.Enabled, Percentile: h.Percentile, Min: h.Min, Max: h.Max,
				Budget: h.Budget, Burst: h.Burst}
		}
	}
	if err := rc.Validate(); err != nil {
		return router.Config{}, err
	}
	return rc, nil
}

// decodeYAML decodes a config file into v, refusing unknown keys. Its errors
// name the key at fault (models.NAME.max_tokens), not only the line.
func decodeYAML(raw []byte, v any) error {
	var root yaml.Node
	if err := yaml.Unmarshal(raw, &root); err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	err := dec.Decode(v)
	if errors.Is(err, io.EOF) { // an empty file
		return nil
	}
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		msgs[i] = m
		if sub := yamlLine.FindStringSubmatch(m); sub != nil {
			line, _ := strconv.Atoi(sub[1])
			if key := yamlKeyAt(&root, line, ""); key != "" {
				what := sub[2]
				if strings.HasPrefix(what, "field ") && strings.Contains(what, " not found in type ") {
					what = "unknown key"
				}
				msgs[i] = fmt.Sprintf("line %d: %s: %s", line, key, what)
			}
		}
	}
	return errors.New(strings.Join(msgs, "; "))
}

var yamlLine = regexp.MustCompile(`^line (\d+): (.*)$`)

// yamlKeyAt returns the dotted path (models.llama.max_tokens, upstreams[0].url)
// of the outermost key on line under n, or "".
func yamlKeyAt(n *yaml.Node, line int, path string) string {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if k := yamlKeyAt(c, line, path); k != "" {
				return k
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			if k.Line == line {
				return p
			}
			if found := yamlKeyAt(v, line, p); found != "" {
				return found
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			if c.Kind == yaml.ScalarNode && c.Line == line {
				return p
			}
			if found := yamlKeyAt(c, line, p); found != "" {
				return found
			}
		}
	}
	return ""
}
