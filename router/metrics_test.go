package router

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// metricValue sums the samples (counter, gauge, or histogram count) of the
// family name whose labels include every name, value pair given.
func metricValue(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
			return l.GetName() == labels[i] && l.GetValue() == labels[i+1]
		}) {
			return false
		}
	}
	return true
}

// TestMetricsKeepTheirNamesAndLabels pins the router's part of the metrics
// contract (DESIGN, README, the dashboard and the e2e tests read these).
func TestMetricsKeepTheirNamesAndLabels(t *testing.T) {
	prom := prometheus.NewRegistry()
	reg := newRegistry(t, Config{Registerer: prom})
	reg.Add(readyReplica("a", "m"))
	reg.Add(readyReplica("b", "m"))
	res, err := reg.Do(context.Background(), hint("m"), func(_ context.Context, _ *Replica, n int, _ AttemptReason) (Attempt, error) {
		if n == 1 {
			return nil, ErrNotSent(errors.New("connection refused"))
		}
		return &fakeAttempt{}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	res.Finish()
	reg.m.hedged("m", true) // a hedge outcome, as Do counts it (hedge_test.go runs real ones)

	want := map[string][]string{
		"tailgate_upstream_attempts_total":       {"model", "reason"},
		"tailgate_retries_total":                 {"class", "model"},
		"tailgate_hedges_total":                  {"model", "outcome"},
		"tailgate_request_attempts":              nil,
		"tailgate_ejections_total":               {"reason", "replica"},
		"tailgate_ejection_delay_seconds":        nil,
		"tailgate_replica_inflight":              {"replica"},
		"tailgate_replica_inflight_class":        {"class", "replica"},
		"tailgate_replica_ready":                 {"replica"},
		"tailgate_replica_lost":                  {"replica"},
		"tailgate_model_ready_replicas":          {"model"},
		"tailgate_replica_engine_waiting":        {"replica"},
		"tailgate_replica_ttft_estimate_seconds": {"replica"},
		"tailgate_replica_score":                 {"replica"},
		"tailgate_retry_budget_tokens":           nil,
		"tailgate_hedge_budget_tokens":           {"model"},
		"tailgate_model_waiting_requests":        {"model"},
		"tailgate_model_inflight_requests":       {"model"},
	}
	mfs, err := prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, mf := range mfs {
		var names []string
		for _, l := range mf.GetMetric()[0].GetLabel() {
			names = append(names, l.GetName())
		}
		got[mf.GetName()] = names
	}
	for name, labels := range want {
		have, ok := got[name]
		if !ok {
			t.Errorf("%s is not exported", name)
			continue
		}
		if !slices.Equal(have, labels) {
			t.Errorf("%s has labels %v, want %v", name, have, labels)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("unexpected metric %s", name)
		}
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"tailgate_upstream_attempts_total", []string{"model", "m", "reason", "first"}, 1},
		{"tailgate_upstream_attempts_total", []string{"model", "m", "reason", "retry"}, 1},
		{"tailgate_retries_total", []string{"model", "m", "class", "not_sent"}, 1},
		{"tailgate_hedges_total", []string{"model", "m", "outcome", "won"}, 1},
		{"tailgate_request_attempts", nil, 1},
		{"tailgate_ejections_total", []string{"reason", "connect"}, 1},
		{"tailgate_ejection_delay_seconds", nil, 1},
		{"tailgate_replica_ready", nil, 1}, // one of two is ejected
		{"tailgate_replica_inflight", nil, 0},
	} {
		if v := metricValue(t, prom, c.name, c.labels...); v != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, v, c.want)
		}
	}
}

func TestNewReturnsMetricRegistrationErrors(t *testing.T) {
	prom := prometheus.NewRegistry()
	newRegistry(t, Config{Registerer: prom})
	_, err := New(Config{Registerer: prom}, nil)
	if err == nil || !strings.Contains(err.Error(), "register metrics") {
		t.Fatalf("a second registry on the same Registerer: err = %v, want a registration error", err)
	}
}
