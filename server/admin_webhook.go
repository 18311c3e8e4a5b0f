package server

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
)

// BudgetWebhookConfig configures a [BudgetWebhook]. Zero values mean the
// defaults given.
type BudgetWebhookConfig struct {
	// URL receives each alert as a JSON POST (http or https).
	URL string
	// Secret signs each POST: X-Tailgate-Signature is "sha256=" and the hex
	// HMAC-SHA256, under Secret, of the X-Tailgate-Timestamp header's value,
	// a ".", and the body. The gateway passes DIR/webhook.secret: a secret
	// of its own, which the receiver keeps and which opens nothing else.
	Secret []byte
	// Client sends the POSTs; nil: a client with a 10 s timeout.
	Client *http.Client
	// Attempts bounds the tries of one alert (0: 4); Backoff is the wait
	// after the first failure, doubled after each (0: 1 s).
	Attempts int
	Backoff  time.Duration
	Log      *slog.Logger
}

// BudgetWebhook posts budget alerts (policy.Config.OnBudgetAlert) to a URL
// from its own goroutine ([BudgetWebhook.Run]): the budget watch never
// waits on the receiver, a failed POST is retried with backoff a bounded
// number of times, and an alert that still fails is logged and dropped.
type BudgetWebhook struct {
	cfg   BudgetWebhookConfig
	queue chan policy.BudgetAlert
}

// webhookQueue bounds the alerts waiting to be sent.
const webhookQueue = 256

// NewBudgetWebhook checks cfg and returns the webhook.
func NewBudgetWebhook(cfg BudgetWebhookConfig) (*BudgetWebhook, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("budget webhook %q: want an http:// or https:// URL", cfg.URL)
	}
	if len(cfg.Secret) == 0 {
		return nil, errors.New("budget webhook: no signing secret")
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Attempts <= 0 {
		cfg.Attempts = 4
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &BudgetWebhook{cfg: cfg, queue: make(chan policy.BudgetAlert, webhookQueue)}, nil
}

// Notify queues an alert; it never blocks (with webhookQueue alerts waiting
// already, it logs and drops this one).
func (w *BudgetWebhook) Notify(a policy.BudgetAlert) {
	select {
	case w.queue <- a:
	default:
		w.cfg.Log.Warn("budget webhook: queue full, alert dropped", "tenant", a.Tenant, "threshold_percent", a.Threshold)
	}
}

// Run sends queued alerts until ctx is done.
func (w *BudgetWebhook) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case a := <-w.queue:
			if err := w.send(ctx, a); err != nil && ctx.Err() == nil {
				w.cfg.Log.Warn("budget webhook: alert not delivered", "tenant", a.Tenant, "threshold_percent", a.Threshold,
					"attempts", w.cfg.Attempts, "err", err)
			}
		}
	}
}

// BudgetAlertJSON is the body of a budget webhook's POST.
type BudgetAlertJSON struct {
	Type             string     `json:"type"` // "budget.threshold"
	Tenant           string     `json:"tenant"`
	ThresholdPercent int64      `json:"threshold_percent"`
	UsedPercent      float64    `json:"used_percent"`
	Budget           string     `json:"budget"` // "tokens" or "cost"
	Used             int64      `json:"used"`   // in the budget's unit (tokens, or micro-units of currency)
	Limit            int64      `json:"limit"`
	Period           string     `json:"period"` // "daily", "weekly", "monthly" or "" (lifetime)
	PeriodStart      *time.Time `json:"period_start"`
	ResetsAt         *time.Time `json:"resets_at"`
	At               time.Time  `json:"at"`
}

func alertJSON(a policy.BudgetAlert) BudgetAlertJSON {
	v := BudgetAlertJSON{Type: "budget.threshold", Tenant: a.Tenant, ThresholdPercent: a.Threshold, UsedPercent: a.UsedPercent,
		Budget: a.Budget, Used: a.Used, Limit: a.Limit, Period: a.Period, At: a.At.UTC()}
	if !a.PeriodStart.IsZero() {
		t := a.PeriodStart.UTC()
		v.PeriodStart = &t
	}
	if !a.ResetsAt.IsZero() {
		t := a.ResetsAt.UTC()
		v.ResetsAt = &t
	}
	return v
}

// SignWebhook is the X-Tailgate-Signature of body sent at timestamp (unix
// seconds, as in X-Tailgate-Timestamp) under secret.
func SignWebhook(secret []byte, timestamp string, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(timestamp))
	m.Write([]byte{'.'})
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// send posts a, retrying a failed POST (an error or a status other than
// 2xx) after Backoff, 2·Backoff, … up to Attempts tries.
func (w *BudgetWebhook) send(ctx context.Context, a policy.BudgetAlert) error {
	body, err := json.Marshal(alertJSON(a))
	if err != nil {
		return err
	}
	wait := w.cfg.Backoff
	var last error
	for try := range w.cfg.Attempts {
		if try > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
			wait *= 2
		}
		if last = w.post(ctx, body); last == nil {
			return nil
		}
	}
	return last
}

func (w *BudgetWebhook) post(ctx context.Context, body []byte) error {
	return postSigned(ctx, w.cfg.Client, w.cfg.URL, w.cfg.Secret, "budget.threshold", "application/json", body)
}

// postSigned POSTs body to url as one of the gateway's webhooks: event in
// X-Tailgate-Event, the time in X-Tailgate-Timestamp (unix seconds) and
// X-Tailgate-Signature ([SignWebhook]) under secret. A status other than
// 2xx is an error. Budget alerts and usage events are signed here, one way.
func postSigned(ctx context.Context, client *http.Client, url string, secret []byte, event, contentType string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("User-Agent", "tailgate-webhook")
	req.Header.Set("X-Tailgate-Event", event)
	req.Header.Set("X-Tailgate-Timestamp", ts)
	req.Header.Set("X-Tailgate-Signature", SignWebhook(secret, ts, body))
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}
