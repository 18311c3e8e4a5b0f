package server

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/tailgate-dev/tailgate/data"
)

// UsageSinkConfig configures a [UsageSink]. Zero values mean the defaults
// given.
type UsageSinkConfig struct {
	// URL receives the events as signed JSON POSTs (http or https); it
	// also names the sink's cursor in the database.
	URL string
	// Secret signs each POST as the budget webhook's are ([SignWebhook]):
	// the gateway passes DIR/webhook.secret.
	Secret []byte
	// Client sends the POSTs; nil: a client with a 10 s timeout.
	Client *http.Client
	// Batch is the most events in one POST; 0: 100.
	Batch int
	// Poll is how long an idle sink waits before looking for new events
	// (and a gateway without the lease before trying to take it); 0: 1 s.
	Poll time.Duration
	// Backoff is the wait after a failed POST, doubled after each further
	// failure up to MaxBackoff; 0: 1 s and 1 min.
	Backoff, MaxBackoff time.Duration
	// Lease is how long this gateway holds the sink without renewing it
	// (gateways sharing a database deliver to a sink one at a time); a
	// gateway that dies holding it is replaced after it runs out. 0: 30 s.
	Lease time.Duration
	// Holder names this gateway in the lease; "": the store's instance id
	// on PostgreSQL, "local" on SQLite (one gateway per file).
	Holder string
	Log    *slog.Logger
}

// UsageSink pushes usage events to a webhook, at least once and in order:
// it POSTs the events after the sink's cursor, a batch at a time, and moves
// the cursor (in the database, so a restarted gateway resumes there) only
// once the receiver answered 2xx. A failed POST is sent again, the same
// events, after a backoff, for as long as it takes: nothing is dropped.
// The receiver deduplicates by the events' ids (a batch whose answer was
// lost arrives twice).
type UsageSink struct {
	cfg   UsageSinkConfig
	store *data.Store
}

// usageEventsContentType is CloudEvents' batched JSON format (its HTTP
// binding): a JSON array of events.
const usageEventsContentType = "application/cloudevents-batch+json"

// NewUsageSink checks cfg and returns the sink of store's events.
func NewUsageSink(cfg UsageSinkConfig, store *data.Store) (*UsageSink, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("usage webhook %q: want an http:// or https:// URL", cfg.URL)
	}
	if len(cfg.Secret) == 0 {
		return nil, errors.New("usage webhook: no signing secret")
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 10 * time.Second}
	}
	cfg.Batch = cmp.Or(cfg.Batch, 100)
	cfg.Poll = cmp.Or(cfg.Poll, time.Second)
	cfg.Backoff = cmp.Or(cfg.Backoff, time.Second)
	cfg.MaxBackoff = max(cmp.Or(cfg.MaxBackoff, time.Minute), cfg.Backoff)
	cfg.Lease = cmp.Or(cfg.Lease, 30*time.Second)
	if cfg.Holder == "" && store != nil {
		cfg.Holder = cmp.Or(store.Instance(), "local")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &UsageSink{cfg: cfg, store: store}, nil
}

// Run delivers events until ctx is done, then gives up its lease (a
// restarted gateway takes the sink at once) and returns nil.
func (s *UsageSink) Run(ctx context.Context) error {
	backoff := s.cfg.Backoff
	failing := 0
	var wait time.Duration
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		if wait > 0 {
			t.Reset(wait)
			select {
			case <-ctx.Done():
				s.release()
				return nil
			case <-t.C:
			}
		} else if ctx.Err() != nil {
			s.release()
			return nil
		}
		wait = s.cfg.Poll
		st, err := s.store.ClaimUsageSink(ctx, s.cfg.URL, s.cfg.Holder, s.cfg.Lease)
		if errors.Is(err, data.ErrSinkLeased) {
			continue // another gateway delivers
		}
		if err != nil {
			if ctx.Err() == nil {
				s.cfg.Log.Warn("usage webhook: reading its cursor", "err", err)
			}
			continue
		}
		evs, err := s.store.UsageEvents(ctx, st.After, s.cfg.Batch)
		if err != nil {
			if ctx.Err() == nil {
				s.cfg.Log.Warn("usage webhook: reading events", "err", err)
			}
			continue
		}
		if len(evs) == 0 {
			continue
		}
		body, err := marshalUsageEvents(evs)
		if err != nil {
			return fmt.Errorf("usage webhook: %w", err)
		}
		if err := postSigned(ctx, s.cfg.Client, s.cfg.URL, s.cfg.Secret, "usage.events", usageEventsContentType, body); err != nil {
			if ctx.Err() != nil {
				continue
			}
			failing++
			s.cfg.Log.Warn("usage webhook: delivery failed; the same events are sent again", "url", s.cfg.URL,
				"events", len(evs), "first", evs[0].RequestID, "failures", failing, "retry_in", backoff, "err", err)
			_ = s.store.FailUsageSink(context.WithoutCancel(ctx), s.cfg.URL, s.cfg.Holder, err.Error())
			wait, backoff = backoff, min(2*backoff, s.cfg.MaxBackoff)
			continue
		}
		if failing > 0 {
			s.cfg.Log.Info("usage webhook: delivering again", "url", s.cfg.URL, "after_failures", failing)
		}
		failing, backoff = 0, s.cfg.Backoff
		// The receiver has the events: record it even if the gateway is
		// stopping, or they are sent again after the restart (harmless,
		// deduplicated by id, but avoidable).
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		ok, err := s.store.AckUsageSink(actx, s.cfg.URL, s.cfg.Holder, evs[len(evs)-1].Seq)
		cancel()
		switch {
		case err != nil:
			s.cfg.Log.Warn("usage webhook: recording the delivery; its events will be sent again", "err", err)
		case !ok:
			s.cfg.Log.Warn("usage webhook: lease lost to another gateway while delivering; it resends from its cursor")
		case len(evs) == s.cfg.Batch:
			wait = 0 // more may be waiting
		}
	}
}

func (s *UsageSink) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.store.ReleaseUsageSink(ctx, s.cfg.URL, s.cfg.Holder); err != nil {
		s.cfg.Log.Warn("usage webhook: releasing its lease", "err", err)
	}
}

func marshalUsageEvents(evs []data.UsageEvent) ([]byte, error) {
	out := make([]UsageEventJSON, len(evs))
	for i, e := range evs {
		out[i] = usageEventJSON(e)
	}
	return json.Marshal(out)
}
