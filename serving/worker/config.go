package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tailgate-dev/tailgate/serving/hop"
)

// Config configures a [Worker]. Zero values mean the documented default; a
// feature is turned off by its own field (NoWarmup, NoDrain).
type Config struct {
	// Gateways are the base URLs of the admin listeners of the gateways
	// the worker registers with, e.g. http://gateway-host:8081, or in mesh
	// mode the gateway's tailnet name, http://tg-gateway:8081. At least one
	// is required. Each gets its own registration and heartbeats, so one
	// that is down does not keep the replica from the others.
	Gateways []string
	// ClusterToken authenticates the worker's heartbeats to the gateway and
	// the gateway's requests to the sidecar. Required.
	ClusterToken string
	// JoinToken is a one-time join token bound to ReplicaID (`tailgate
	// workers invite`), presented until the worker has a credential: it
	// admits a new replica id without an operator's approval. "" means
	// none: a new id then waits, retrying, until the operator approves it.
	JoinToken string

	// Listener is where the sidecar serves the gateway: a TCP listener, or
	// one on the tailnet in mesh mode. Required; Run closes it.
	Listener net.Listener
	// Advertise is the sidecar's base URL as the gateway should call it.
	// "" means "http://" and Listener's address, which must then not be a
	// wildcard address such as 0.0.0.0.
	Advertise string
	// ReplicaID names the replica at the gateway; "" means the host name
	// and Listener's port, e.g. "gpu-box-9000".
	ReplicaID string
	// DataDir keeps the worker's credentials across restarts: the gateway
	// gives a replica id to the credential it first registered with, for
	// good. The file is credential-<replica id> with one gateway, and
	// credential-<replica id>@<gateway host:port> for each of several
	// (gateways sharing a database accept one another's credential, so
	// their files then hold the same one). "" keeps them in memory only,
	// so a restarted worker cannot take its id back until the old
	// credential is revoked.
	DataDir string
	// DialGateway dials the gateway for heartbeats; nil means a plain TCP
	// dial. A mesh node's Dial goes here so heartbeats use the tailnet.
	DialGateway func(ctx context.Context, network, address string) (net.Conn, error)
	// UpstreamClient carries the sidecar's requests to the engine: "" or
	// hop.Hop, or hop.NetHTTP (net/http's Transport, the way back).
	UpstreamClient hop.Client

	// Model is the model name clients use; the engine must serve it under
	// this name. Required.
	Model string
	// Engine is the engine's kind as the gateway shows it; "" means "vllm".
	// With "sim" the worker says in its log that answers are simulated.
	Engine string
	// Command builds the engine's command line for an engine listening on
	// the Unix socket at socket, in a directory only the worker's user can
	// open, and on no TCP port; see launcher.Config.Command and
	// launcher.VLLMCommand. Required.
	Command func(socket string) (argv, env []string, err error)
	// StartupTimeout bounds the engine's start up to readiness; 0 means
	// launcher.DefaultStartupTimeout (20m).
	StartupTimeout time.Duration
	// Warmup is the number of short generations run before the replica is
	// announced ready; 0 means launcher.DefaultWarmup (3).
	Warmup int
	// NoWarmup announces the replica ready as soon as the engine serves the
	// model, without warm-up.
	NoWarmup bool

	// DrainGrace is how long in-flight requests may finish once Run's
	// context ends, before the engine is stopped; 0 means
	// DefaultDrainGrace.
	DrainGrace time.Duration
	// NoDrain cuts in-flight requests at once on shutdown; the gateway is
	// still told the replica is draining first.
	NoDrain bool

	// SleepMode lets the gateway put the engine to sleep and wake it
	// through the sidecar (sidecar.Config.SleepMode); the engine must run
	// with sleep mode (Command's business: launcher.VLLMOptions.SleepMode,
	// or the simulator's --sim-sleep-mode).
	SleepMode bool
	// PriorityScheduling tells the gateway that the engine runs with
	// priority scheduling (vllm serve --scheduling-policy priority), so the
	// gateway sends each request's priority from its key's class
	// (serving.Heartbeat.PriorityScheduling). The engine must run so
	// (Command's business: launcher.VLLMOptions.PriorityScheduling, or the
	// simulator's --sim-scheduling-policy priority); an engine that does not
	// refuses the requests of interactive and batch keys.
	PriorityScheduling bool
	// PreemptFile is a path whose appearance announces that the machine is
	// being preempted (a spot VM's metadata agent can be scripted to touch
	// it; one already there at start counts, so keep it on a tmpfs such as
	// /run). The worker then drains as on shutdown, telling the gateway the
	// replica drains because it is preempted, and Run returns. "": none.
	PreemptFile string
	// PreemptURL is polled as a preemption notice: an answer 200 whose body
	// is neither empty nor "false" (GCP's .../instance/preempted says TRUE,
	// AWS's .../spot/instance-action answers 404 until a notice) announces
	// it, as PreemptFile does. "": none.
	PreemptURL string
	// PreemptPoll is how often PreemptFile and PreemptURL are looked at; 0
	// means 1s (a spot notice comes 30 s to 2 min ahead).
	PreemptPoll time.Duration
	// Preempt announces a preemption by a signal, as PreemptFile does
	// (`tailgate worker` sends SIGUSR1 here); nil: none.
	Preempt <-chan os.Signal

	// Log receives the worker's, the sidecar's and the engine's lines; nil
	// discards them.
	Log *slog.Logger
	// Tracer, when set, makes the sidecar's spans (see sidecar.Config.Tracer);
	// nil: none.
	Tracer trace.TracerProvider
}

// DefaultDrainGrace is the default of [Config.DrainGrace].
const DefaultDrainGrace = 30 * time.Second

// Validate reports whether c is usable.
func (c Config) Validate() error {
	switch {
	case len(c.Gateways) == 0:
		return errors.New("worker: a gateway URL is required")
	case c.ClusterToken == "":
		return errors.New("worker: ClusterToken is required")
	case c.Listener == nil:
		return errors.New("worker: Listener is required")
	case c.Model == "":
		return errors.New("worker: Model is required")
	case c.Command == nil:
		return errors.New("worker: Command is required")
	case c.Warmup < 0:
		return errors.New("worker: Warmup must not be negative (NoWarmup turns it off)")
	case c.StartupTimeout < 0, c.DrainGrace < 0, c.PreemptPoll < 0:
		return errors.New("worker: durations must not be negative")
	}
	if c.PreemptURL != "" {
		if u, err := url.Parse(c.PreemptURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("worker: preemption URL %q is not an http(s) URL", c.PreemptURL)
		}
	}
	seen := map[string]bool{}
	for _, g := range c.Gateways {
		u, err := url.Parse(g)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("worker: gateway URL %q is not an http(s) URL", g)
		}
		if seen[u.Host] {
			return fmt.Errorf("worker: gateway %s is named twice", u.Host)
		}
		seen[u.Host] = true
	}
	if c.Advertise == "" && wildcard(c.Listener.Addr()) {
		return fmt.Errorf("worker: Listener %s binds every interface: Advertise is required", c.Listener.Addr())
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Engine == "" {
		c.Engine = "vllm"
	}
	if c.DrainGrace == 0 {
		c.DrainGrace = DefaultDrainGrace
	}
	if c.PreemptPoll == 0 {
		c.PreemptPoll = time.Second
	}
	if c.NoDrain {
		c.DrainGrace = 0
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// wildcard reports whether addr is a TCP address on every interface, which
// a gateway cannot call.
func wildcard(addr net.Addr) bool {
	host, _, err := net.SplitHostPort(addr.String())
	return err == nil && (host == "0.0.0.0" || host == "::")
}
