package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/tailgate-dev/tailgate/serving"
)

// Preemption notices: a spot VM is announced to go away 30 s (GCP) to 2 min
// (AWS) ahead. The worker hears it from a file that appears, a URL that
// says so, or a signal, and drains at once: the gateway hears "draining,
// preempted: …" and its fleet controller starts a replacement while the
// requests in flight here finish.

// watchPreempt returns a channel that receives, once, what announced a
// preemption; it looks until ctx ends. Nothing to watch: nil, which never
// receives.
func (w *Worker) watchPreempt(ctx context.Context, g interface{ Go(func() error) }) <-chan string {
	cfg := w.cfg
	if cfg.PreemptFile == "" && cfg.PreemptURL == "" && cfg.Preempt == nil {
		return nil
	}
	out := make(chan string, 1)
	client := &http.Client{Timeout: min(cfg.PreemptPoll, 2*time.Second)}
	g.Go(func() error {
		t := time.NewTicker(cfg.PreemptPoll)
		defer t.Stop()
		for {
			if why := w.preemptNotice(ctx, client); why != "" {
				out <- why
				return nil
			}
			select {
			case <-ctx.Done():
				return nil
			case sig := <-cfg.Preempt: // nil channel: never
				out <- fmt.Sprintf("signal %s", sig)
				return nil
			case <-t.C:
			}
		}
	})
	return out
}

// preemptNotice says what announces a preemption now, or "".
func (w *Worker) preemptNotice(ctx context.Context, client *http.Client) string {
	if f := w.cfg.PreemptFile; f != "" {
		if _, err := os.Stat(f); err == nil {
			return "notice file " + f + " appeared"
		} else if !errors.Is(err, os.ErrNotExist) {
			w.log.Debug("preemption file not readable", "path", f, "err", err)
		}
	}
	if u := w.cfg.PreemptURL; u != "" {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return ""
		}
		req.Header.Set("Metadata-Flavor", "Google") // GCP's metadata server wants it; others ignore it
		resp, err := client.Do(req)
		if err != nil {
			w.log.Debug("preemption URL not answering", "url", u, "err", err)
			return ""
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if b := strings.TrimSpace(string(body)); resp.StatusCode == http.StatusOK && b != "" && !strings.EqualFold(b, "false") {
			return "notice URL " + u + " says " + firstLine(b, 120)
		}
	}
	return ""
}

func firstLine(s string, n int) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > n {
		s = s[:n]
	}
	return s
}

// preemptedWhy is the replica's draining reason for a notice.
func preemptedWhy(notice string) string { return serving.ReasonPreempted + ": " + notice }
