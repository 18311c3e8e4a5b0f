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

	"github.com/tailgate-dev/tailgate/serving"
)

// maxMetricsBody bounds an engine's /metrics answer.
const maxMetricsBody = 16 << 20

// vLLM's names for the load the sidecar reports (vllm/v1/metrics/loggers.py;
// counters carry "_total" on the wire). vLLM renamed gpu_cache_usage_perc to
// kv_cache_usage_perc; older builds send the old one. Every series has the
// labels model_name and engine (the data-parallel rank).
const (
	metricWaiting         = "vllm:num_requests_waiting"
	metricWaitingByReason = "vllm:num_requests_waiting_by_reason" // label reason: capacity, deferred
	metricRunning         = "vllm:num_requests_running"
	metricKVUsage         = "vllm:kv_cache_usage_perc"
	metricKVUsageOld      = "vllm:gpu_cache_usage_perc"
	metricPreemptions     = "vllm:num_preemptions_total"
	metricPrefixQueries   = "vllm:prefix_cache_queries_total"
	metricPrefixHits      = "vllm:prefix_cache_hits_total"
	// One series per sleep_state (awake, weights_offloaded, discard_all),
	// 1 for the state the engine is in.
	metricSleepState = "vllm:engine_sleep_state"
)

// engineLoad is what one scrape of the engine's /metrics said, in the
// heartbeat's terms (Inflight and TTFT are the sidecar's own).
type engineLoad serving.Load

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
	s.mu.Lock()
	gen := s.sleep.gen
	s.mu.Unlock()
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
	s.mu.Lock()
	if s.sleep.gen != gen {
		s.mu.Unlock()
		return nil // a sleep or wake happened meanwhile: this reading is stale
	}
	was := s.sleepReason()
	s.scraped.Store(l)
	now := s.sleepReason()
	s.mu.Unlock()
	if now != was {
		if now != "" {
			s.log.Warn("engine asleep: replica out of service until it wakes", "reason", now)
		} else {
			s.log.Info("engine awake: replica back in service")
		}
		s.stateChanged()
	}
	return nil
}

// sleepReason says why the engine serves nothing while vLLM's sleep mode has
// put it to sleep (it still answers /health), or "" while it is awake or
// does not say.
func (s *Sidecar) sleepReason() string {
	e := s.scraped.Load()
	if e == nil {
		return ""
	}
	switch e.SleepState {
	case serving.SleepWeightsOffloaded:
		return "engine asleep (vLLM sleep level 1: weights offloaded to CPU); POST /wake_up to the sidecar (the gateway's fleet controller does when requests wait) wakes it"
	case serving.SleepDiscardAll:
		return "engine asleep (vLLM sleep level 2: weights and KV cache discarded); POST /wake_up to the sidecar (the gateway's fleet controller does when requests wait) wakes it"
	}
	return ""
}

// parseMetrics reads Prometheus text exposition. Counts are summed over
// label sets (one per model or data-parallel rank); cache usage, a
// fraction, is their mean.
func parseMetrics(r io.Reader) (*engineLoad, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse engine metrics: %w", err)
	}
	l := &engineLoad{
		Waiting:            sum(fams[metricWaiting], "", ""),
		Running:            sum(fams[metricRunning], "", ""),
		Preemptions:        sum(fams[metricPreemptions], "", ""),
		PrefixCacheQueries: sum(fams[metricPrefixQueries], "", ""),
		PrefixCacheHits:    sum(fams[metricPrefixHits], "", ""),
	}
	kv := fams[metricKVUsage]
	if kv == nil {
		kv = fams[metricKVUsageOld]
	}
	if kv != nil && len(kv.GetMetric()) > 0 {
		l.KVCacheUsage = sum(kv, "", "") / float64(len(kv.GetMetric()))
	}
	if f := fams[metricWaitingByReason]; f != nil {
		l.WaitingByReason = &serving.WaitReasons{
			Capacity: sum(f, "reason", "capacity"),
			Deferred: sum(f, "reason", "deferred"),
		}
	}
	if f := fams[metricSleepState]; f != nil {
		// Awake while any rank is; asleep at the deepest level a rank is at.
		switch {
		case sum(f, "sleep_state", serving.SleepAwake) > 0:
			l.SleepState = serving.SleepAwake
		case sum(f, "sleep_state", serving.SleepDiscardAll) > 0:
			l.SleepState = serving.SleepDiscardAll
		default:
			l.SleepState = serving.SleepWeightsOffloaded
		}
	}
	return l, nil
}

// sum adds f's values, of the series whose label name has value value when
// name is not "".
func sum(f *dto.MetricFamily, name, value string) float64 {
	var v float64
	for _, m := range f.GetMetric() {
		if name != "" && !hasLabel(m, name, value) {
			continue
		}
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

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue() == value
		}
	}
	return false
}

// Load returns the replica's load: the last good scrape of the engine, the
// requests in the sidecar now, and the median engine time to first token
// of recent requests.
func (s *Sidecar) Load() serving.Load {
	var l serving.Load
	if e := s.scraped.Load(); e != nil {
		l = serving.Load(*e) // WaitingByReason is shared: never changed after the scrape
	}
	l.Inflight = s.Inflight()
	l.TTFTMillisP50 = s.ttft.median().Seconds() * 1000
	return l
}
