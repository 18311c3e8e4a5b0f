package sidecar

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"tailgate/serving"
)

// maxMetricsBody bounds an engine's /metrics answer.
const maxMetricsBody = 16 << 20

// vLLM's names for the load the sidecar reports. vLLM renamed
// gpu_cache_usage_perc to kv_cache_usage_perc; older builds send the old one.
const (
	metricWaiting    = "vllm:num_requests_waiting"
	metricRunning    = "vllm:num_requests_running"
	metricKVUsage    = "vllm:kv_cache_usage_perc"
	metricKVUsageOld = "vllm:gpu_cache_usage_perc"
)

// engineLoad is what one scrape of the engine's /metrics said.
type engineLoad struct {
	waiting, running, kvUsage float64
}

// Run watches the engine until ctx ends, then returns nil: it asks its
// /health (see [Config.UnhealthyAfter]) and scrapes its /metrics every
// ScrapeInterval, at once first.
func (s *Sidecar) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { s.watchEngine(ctx) })
	s.scrapeLoop(ctx)
	wg.Wait()
	return nil
}

// scrapeLoop scrapes until ctx ends. A failed scrape keeps the last good
// numbers (an overloaded engine that answers late must not look idle) and is
// logged once per streak of failures: as a warning while the replica is
// ready, at debug level while the engine is expected to be down.
func (s *Sidecar) scrapeLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.ScrapeInterval)
	defer t.Stop()
	var failing slog.Level
	streak := false
	for {
		err := s.scrape(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !streak:
			streak = true
			failing = slog.LevelDebug
			if _, _, ready := s.health(); ready {
				failing = slog.LevelWarn
			}
			s.log.Log(ctx, failing, "scrape engine metrics", "err", err)
		case err == nil && streak:
			streak = false
			s.log.Log(ctx, failing, "engine metrics scraped again")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// scrape reads the engine's /metrics once, within most of an interval.
func (s *Sidecar) scrape(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ScrapeInterval*4/5)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.cfg.EngineURL()+"/metrics", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	s.authorize(req)
	resp, err := s.transport.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return fmt.Errorf("engine /metrics answered %s", resp.Status)
	}
	l, err := parseMetrics(io.LimitReader(resp.Body, maxMetricsBody))
	if err != nil {
		return err
	}
	s.scraped.Store(l)
	return nil
}

// parseMetrics reads Prometheus text exposition. Waiting and running are
// summed over label sets (one per model or data-parallel rank); cache usage,
// a fraction, is their mean.
func parseMetrics(r io.Reader) (*engineLoad, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse engine metrics: %w", err)
	}
	l := &engineLoad{
		waiting: sum(fams[metricWaiting]),
		running: sum(fams[metricRunning]),
	}
	kv := fams[metricKVUsage]
	if kv == nil {
		kv = fams[metricKVUsageOld]
	}
	if kv != nil && len(kv.GetMetric()) > 0 {
		l.kvUsage = sum(kv) / float64(len(kv.GetMetric()))
	}
	return l, nil
}

func sum(f *dto.MetricFamily) float64 {
	var v float64
	for _, m := range f.GetMetric() {
		switch {
		case m.GetGauge() != nil:
			v += m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			v += m.GetUntyped().GetValue()
		case m.GetCounter() != nil:
			v += m.GetCounter().GetValue()
		}
	}
	return v
}

// Load returns the replica's load: the last good scrape of the engine, the
// requests in the sidecar now, and the median engine time to first token
// of recent requests.
func (s *Sidecar) Load() serving.Load {
	l := serving.Load{
		Inflight:      s.Inflight(),
		TTFTMillisP50: s.ttft.median().Seconds() * 1000,
	}
	if e := s.scraped.Load(); e != nil {
		l.Waiting, l.Running, l.KVCacheUsage = e.waiting, e.running, e.kvUsage
	}
	return l
}
