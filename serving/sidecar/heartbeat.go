package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tailgate-dev/tailgate/serving"
)

// HeartbeatConfig describes a worker's registration with a gateway.
type HeartbeatConfig struct {
	// GatewayURL is the base URL of the gateway's admin listener, e.g.
	// http://127.0.0.1:8081 or, in mesh mode, http://tg-gateway:8081.
	// Required.
	GatewayURL string
	// ClusterToken is sent as bearer token with every beat. Required. The
	// gateway answers the first beat with a per-worker credential, which
	// the heartbeater keeps in memory and sends with every later beat
	// (serving.HeaderWorkerCredential).
	ClusterToken string
	// JoinToken is a one-time join token (from `tailgate workers invite`)
	// sent beside the cluster token while the heartbeater has no
	// credential: with it the gateway admits a new replica id without an
	// operator's approval. "" sends none.
	JoinToken string
	// Key is the worker's key (serving.LoadWorkerKey), sent while the
	// heartbeater has no credential: an approval binds its approval code,
	// which the heartbeater logs while it waits. "" sends none.
	Key string
	// Interval is the time between beats; 0 means 1s. The gateway drops a
	// replica that misses about three.
	Interval time.Duration
	// Build returns the heartbeat to send; it is called for every beat, one
	// call at a time. Required.
	Build func() serving.Heartbeat
	// Client sends the beats; nil means a client with a 2s timeout. Each
	// beat also gets a deadline of the client's timeout, or 2s if it has
	// none.
	Client *http.Client
	// Log receives the registration's log lines; nil discards them.
	Log *slog.Logger
	// CredentialFile keeps the credential across restarts (mode 0600): a
	// replica id belongs to the credential it was first registered with,
	// so a worker that lost it cannot take its own id back until the old
	// credential is revoked. "" keeps it in memory only.
	CredentialFile string
	// Borrow returns credentials this worker holds from its other
	// gateways. While it has none of its own, the heartbeater offers them
	// to this gateway (in order) before registering with the cluster token
	// alone: gateways that share one database know each other's
	// credentials, and there the replica id already belongs to the first
	// one issued. A gateway that does not know one says so and the next is
	// tried. nil offers none.
	Borrow func() []string
	// Registering, if set, is held while this heartbeater, with no
	// credential of its own, borrows one or registers with the cluster
	// token: a worker's heartbeaters that share it register one at a time,
	// so those after the first borrow its credential instead of each
	// getting one of their own (which a shared database would then hold
	// twice for one replica id).
	Registering sync.Locker
}

const (
	// failingRepeat is how often a failure streak is logged again.
	failingRepeat            = time.Minute
	defaultHeartbeatInterval = time.Second
	defaultBeatTimeout       = 2 * time.Second
)

// Validate reports whether c is usable.
func (c HeartbeatConfig) Validate() error {
	switch {
	case c.GatewayURL == "":
		return errors.New("heartbeat: gateway URL is required")
	case c.ClusterToken == "":
		return errors.New("heartbeat: cluster token is required")
	case c.Build == nil:
		return errors.New("heartbeat: build function is required")
	case c.Interval < 0:
		return errors.New("heartbeat: interval must not be negative")
	}
	u, err := url.Parse(c.GatewayURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("heartbeat: gateway URL %q is not an http(s) URL", c.GatewayURL)
	}
	return nil
}

// Errors a beat may end in, besides transport errors and unexpected answers.
var (
	// ErrTokenRejected means the gateway refused the cluster token.
	ErrTokenRejected = errors.New("gateway rejected the cluster token")
	// ErrCredentialUnknown means the gateway does not know this worker's
	// credential (e.g. its data was reset); the next beat registers
	// afresh with the cluster token.
	ErrCredentialUnknown = errors.New("gateway does not know this worker's credential")
	// ErrRefused means the gateway accepted the token but refused this
	// worker (403): a tailnet peer outside --mesh-allow-peers, a replica id
	// or address held by another worker or a configured upstream, or a
	// revoked credential.
	ErrRefused = errors.New("gateway refused this worker's registration")
	// ErrNotApproved means the gateway does not admit this new replica id
	// on the cluster token alone: an operator must approve it, or the
	// worker must present a join token. The beats go on, so the worker
	// registers as soon as it is approved.
	ErrNotApproved = errors.New("gateway has not approved this replica id")
	// ErrGatewayUnreachable means no connection to the gateway could be made.
	ErrGatewayUnreachable = errors.New("gateway unreachable")
	// ErrNotAdminListener means the gateway URL answered 404 to the
	// registration: it is not a gateway's admin listener (most often its
	// public API listener). Run stops with it unless the gateway had
	// accepted a beat before: retrying cannot help.
	ErrNotAdminListener = errors.New("not a gateway's admin listener")
)

// Heartbeater registers a replica with a gateway and keeps it registered.
// It is safe for concurrent use.
type Heartbeater struct {
	cfg      HeartbeatConfig // defaults applied
	endpoint string
	client   *http.Client
	timeout  time.Duration
	log      *slog.Logger

	// sem serializes beats, so a beat built after a state change is never
	// overtaken by one built before it. It also guards the fields below.
	sem        chan struct{}
	registered bool   // the last beat succeeded
	ever       bool   // a beat succeeded once
	credential string // issued by the gateway on the first good beat; "" before
	failing    string // message of the failure streak being logged; "" if none
	// failingSince is when the streak began, failedAt when it was last logged.
	failingSince, failedAt time.Time
	// unknown holds the borrowed credentials this gateway did not know.
	unknown map[string]bool

	// held is credential, readable by other heartbeaters' Borrow without sem.
	held atomic.Pointer[string]

	kick chan struct{} // Kick's request for a beat now (capacity 1)
}

// Kick asks Run to beat now rather than at the next tick (after a state
// change). It never blocks; kicks made before that beat starts merge.
func (h *Heartbeater) Kick() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// NewHeartbeater returns a heartbeater for cfg.
func NewHeartbeater(cfg HeartbeatConfig) (*Heartbeater, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Interval == 0 {
		cfg.Interval = defaultHeartbeatInterval
	}
	h := &Heartbeater{
		cfg:      cfg,
		endpoint: strings.TrimRight(cfg.GatewayURL, "/") + serving.HeartbeatPath,
		client:   cfg.Client,
		timeout:  defaultBeatTimeout,
		log:      cfg.Log,
		sem:      make(chan struct{}, 1),
		kick:     make(chan struct{}, 1),
	}
	if f := cfg.CredentialFile; f != "" {
		switch b, err := os.ReadFile(f); {
		case err == nil:
			h.credential = strings.TrimSpace(string(b))
			h.held.Store(&h.credential)
		case !errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("heartbeat: worker credential: %w", err)
		}
	}
	if h.client == nil {
		h.client = &http.Client{Timeout: defaultBeatTimeout}
	} else if h.client.Timeout > 0 {
		h.timeout = h.client.Timeout
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	return h, nil
}

// Run beats at once, then every Interval until ctx ends; it then returns
// nil. Failures do not stop it — the first of a streak is logged (again if
// the kind of failure changes), and "registered with gateway" is logged on
// the first success and on every recovery — except [ErrNotAdminListener]
// before any beat succeeded, which Run returns: the worker was pointed at
// the wrong URL.
func (h *Heartbeater) Run(ctx context.Context) error {
	t := time.NewTicker(h.cfg.Interval)
	defer t.Stop()
	for {
		if err := h.Beat(ctx); errors.Is(err, ErrNotAdminListener) && !h.everRegistered() {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-h.kick:
		}
	}
}

// Beat sends one heartbeat now, e.g. right after a state change, and logs
// its outcome the way Run does; callers need not log the error again.
func (h *Heartbeater) Beat(ctx context.Context) error {
	select {
	case h.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-h.sem }()

	hb := h.cfg.Build()
	err := h.sendBorrowing(ctx, &hb)
	if ctx.Err() != nil {
		return err // shutting down: not a failure worth a log line
	}
	if errors.Is(err, ErrNotAdminListener) && !h.ever {
		return err // Run returns it: the worker stops and says why, once
	}
	h.record(&hb, err)
	return err
}

// everRegistered reports whether a beat ever succeeded.
func (h *Heartbeater) everRegistered() bool {
	h.sem <- struct{}{}
	defer func() { <-h.sem }()
	return h.ever
}

// Credential returns the credential this gateway issued to the worker (or
// accepted from another gateway on its database), "" while it has none.
func (h *Heartbeater) Credential() string {
	if c := h.held.Load(); c != nil {
		return *c
	}
	return ""
}

// sendBorrowing sends hb; with no credential of its own, it first offers
// the ones Borrow returns that this gateway has not refused.
func (h *Heartbeater) sendBorrowing(ctx context.Context, hb *serving.Heartbeat) error {
	if h.credential == "" && h.cfg.Registering != nil {
		h.cfg.Registering.Lock()
		defer h.cfg.Registering.Unlock()
	}
	if h.credential == "" && h.cfg.Borrow != nil {
		for _, c := range h.cfg.Borrow() {
			if c == "" || h.unknown[c] {
				continue
			}
			h.credential = c
			err := h.send(ctx, hb)
			if err == nil {
				h.keepCredential() // this gateway's too now
				h.log.Info("gateway accepted the credential another gateway issued (they share a database)",
					"gateway", h.cfg.GatewayURL, "replica", hb.ReplicaID)
				return nil
			}
			h.credential = ""
			h.held.Store(nil)
			if !errors.Is(err, ErrCredentialUnknown) && !errors.Is(err, ErrRefused) {
				return err // unreachable, or the like: offered again at the next beat
			}
			if h.unknown == nil {
				h.unknown = map[string]bool{}
			}
			h.unknown[c] = true
		}
	}
	return h.send(ctx, hb)
}

func (h *Heartbeater) send(ctx context.Context, hb *serving.Heartbeat) error {
	body, err := json.Marshal(hb)
	if err != nil {
		return fmt.Errorf("encode heartbeat: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.endpoint, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("heartbeat request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+h.cfg.ClusterToken)
	if h.credential != "" {
		req.Header.Set(serving.HeaderWorkerCredential, h.credential)
	} else {
		if h.cfg.JoinToken != "" {
			req.Header.Set(serving.HeaderJoinToken, h.cfg.JoinToken)
		}
		if h.cfg.Key != "" {
			req.Header.Set(serving.HeaderWorkerKey, h.cfg.Key)
		}
	}
	resp, err := h.client.Do(req)
	if err != nil {
		if op, ok := errors.AsType[*net.OpError](err); ok && op.Op == "dial" {
			return fmt.Errorf("%w at %s: %w", ErrGatewayUnreachable, h.cfg.GatewayURL, op)
		}
		return fmt.Errorf("heartbeat to %s: %w", h.cfg.GatewayURL, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e struct {
		Error struct {
			Message string `json:"message"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	switch {
	case resp.StatusCode == http.StatusOK:
		var reply serving.HeartbeatReply
		if err := json.Unmarshal(raw, &reply); err == nil && reply.Credential != "" {
			h.credential = reply.Credential
			h.keepCredential()
		}
		return nil
	case resp.StatusCode == http.StatusUnauthorized:
		if _ = json.Unmarshal(raw, &e); e.Error.Code == "invalid_worker_credential" {
			h.credential = ""
			h.keepCredential()
			return ErrCredentialUnknown
		}
		return ErrTokenRejected
	case resp.StatusCode == http.StatusForbidden:
		// The token was fine; the gateway refuses this worker (e.g. a tailnet
		// peer outside its allow list) and says why.
		_ = json.Unmarshal(raw, &e)
		if e.Error.Code == "worker_not_approved" {
			return fmt.Errorf("%w: %s", ErrNotApproved, e.Error.Message)
		}
		return fmt.Errorf("%w: %s", ErrRefused, e.Error.Message)
	case resp.StatusCode == http.StatusNotFound:
		err := fmt.Errorf("%w: %s answered 404 to POST %s; point --gateway at the gateway's admin listener "+
			"(its --admin-listen, port 8081 by default; in mesh mode http://<gateway tailnet name>:<admin port>), not at its public API",
			ErrNotAdminListener, h.cfg.GatewayURL, serving.HeartbeatPath)
		if _ = json.Unmarshal(raw, &e); e.Error.Message != "" {
			err = fmt.Errorf("%w (the gateway said: %s)", err, e.Error.Message)
		}
		return err
	default:
		return fmt.Errorf("heartbeat to %s: gateway answered %s", h.cfg.GatewayURL, resp.Status)
	}
}

// record logs the beat's outcome when it starts or ends a streak of
// failures. The caller holds sem.
func (h *Heartbeater) record(hb *serving.Heartbeat, err error) {
	if err == nil {
		if !h.registered {
			h.log.Info("registered with gateway", "gateway", h.cfg.GatewayURL,
				"replica", hb.ReplicaID, "state", hb.State)
		}
		h.registered, h.ever, h.failing = true, true, ""
		return
	}
	h.registered = false
	var msg string
	switch {
	case errors.Is(err, ErrTokenRejected):
		msg = "gateway rejected the cluster token"
	case errors.Is(err, ErrCredentialUnknown):
		msg = "gateway does not know this worker's credential: registering afresh"
	case errors.Is(err, ErrNotApproved):
		msg = fmt.Sprintf("waiting for the operator to admit this worker (retrying every %s): on the gateway's box run "+
			"`tailgate workers approve --data DIR %s --code %s`, or restart this worker with --join-token-file holding the token of "+
			"`tailgate workers invite --data DIR --replica-id %s`", h.cfg.Interval, hb.ReplicaID, serving.ApprovalCode(h.cfg.Key), hb.ReplicaID)
	case errors.Is(err, ErrRefused):
		msg = "gateway refused this worker's registration"
	case errors.Is(err, ErrGatewayUnreachable):
		msg = "gateway unreachable at " + h.cfg.GatewayURL
	case errors.Is(err, ErrNotAdminListener):
		msg = "not a gateway's admin listener: " + h.cfg.GatewayURL
	default:
		msg = "heartbeat to gateway failed"
	}
	if msg == h.failing {
		// Still failing: said again once a minute, so a worker whose
		// other gateways are fine keeps saying which one is not.
		if time.Since(h.failedAt) < failingRepeat {
			return
		}
		h.log.Warn(msg+" (still)", "gateway", h.cfg.GatewayURL, "replica", hb.ReplicaID, "err", err,
			"since", time.Since(h.failingSince).Round(time.Second))
		h.failedAt = time.Now()
		return
	}
	h.failing, h.failedAt, h.failingSince = msg, time.Now(), time.Now()
	h.log.Warn(msg, "gateway", h.cfg.GatewayURL, "replica", hb.ReplicaID, "err", err)
}

// keepCredential writes the credential to CredentialFile (removes the file
// when there is none), replacing it whole. A failure is logged: the worker
// still works, but would lose its replica id with a restart.
func (h *Heartbeater) keepCredential() {
	if h.credential == "" {
		h.held.Store(nil)
	} else {
		c := h.credential
		h.held.Store(&c)
	}
	f := h.cfg.CredentialFile
	if f == "" {
		return
	}
	if h.credential == "" {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			h.log.Warn("cannot remove the worker's old credential", "file", f, "err", err)
		}
		return
	}
	tmp := f + ".tmp"
	err := os.WriteFile(tmp, []byte(h.credential+"\n"), 0o600)
	if err == nil {
		err = os.Rename(tmp, f)
	}
	if err != nil {
		h.log.Warn("cannot keep the worker's credential: after a restart this replica id stays refused until the credential is revoked",
			"file", f, "err", err)
	}
}
