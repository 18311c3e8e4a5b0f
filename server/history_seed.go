package server

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/tailgate-dev/tailgate/data"
)

// A restarted gateway's registry starts at zero, so the dashboard's last
// hour would start empty. seedHistory rebuilds it from the ledger instead:
// the rows of the span the ring covers, bucketed into points of
// HistoryInterval. A row carries a request's status, stream flag, TTFT,
// tokens, hedge overhead and cost, which is what the charts and the first
// line show; replica load, ejections and hedge outcomes are not in the
// ledger, and rebuilt points say so (FromLedger). On PostgreSQL the ledger
// is shared, so the rebuilt hour counts every gateway's requests where the
// live points count this gateway's.

// seedHistory fills the ring with the ledger's rows of the ring's span
// ending at now, from the first point that has a request; nothing when the
// span has none. Rows are read a minute at a time (the ledger's ts index),
// so memory holds one minute of rows at most.
func (s *Server) seedHistory(ctx context.Context, now time.Time) error {
	step := s.cfg.HistoryInterval
	n := historyPoints
	start := now.Add(-time.Duration(n) * step)
	pts := make([]HistoryPoint, n)
	spent := make([]map[string]int64, n) // cost micros per point and tenant
	for i := range pts {
		pts[i] = HistoryPoint{Time: start.Add(time.Duration(i+1) * step), Seconds: step.Seconds(), FromLedger: true,
			Errors: map[string]float64{}, Ejections: map[string]float64{}, Replicas: map[string]ReplicaLoad{},
			TenantSpentUSD: map[string]float64{}, ttft: map[string][]bucket{}}
	}
	chunk := step * time.Duration(max(1, int64(time.Minute/step)))
	first := n
	for from := start; from.Before(now); from = from.Add(chunk) {
		until := from.Add(chunk)
		if until.After(now) {
			until = now
		}
		rows, err := s.store.LedgerRows(ctx, data.UsageFilter{Since: from, Until: until})
		if err != nil {
			return fmt.Errorf("seed history: %w", err)
		}
		for _, r := range rows {
			i := int(r.Time.Sub(start) / step)
			if r.Outcome == data.OutcomeOpen || i < 0 || i >= n {
				continue
			}
			first = min(first, i)
			p := &pts[i]
			p.Requests++
			if class := errorClass(strconv.Itoa(r.Status)); class != "" {
				p.Errors[class]++
			}
			p.PromptTokens += float64(r.PromptTokens)
			p.CompletionTokens += float64(r.CompletionTokens)
			p.HedgeOverhead += float64(r.HedgeOverheadTokens)
			if r.Stages.TTFT >= 0 {
				answer := "json"
				if r.Stream {
					answer = "stream"
				}
				p.ttft[answer] = observe(p.ttft[answer], r.Stages.TTFT.Seconds())
			}
			if r.CostMicros != 0 {
				if spent[i] == nil {
					spent[i] = map[string]int64{}
				}
				spent[i][r.Tenant] += r.CostMicros
			}
		}
	}
	if first == n {
		return nil
	}
	for i := range pts {
		pts[i].TTFT = map[string]Percentiles{}
		for answer, bs := range pts[i].ttft {
			pts[i].TTFT[answer] = percentiles(bs)
		}
	}
	s.seedSpend(ctx, pts, spent)
	s.hist.mu.Lock()
	defer s.hist.mu.Unlock()
	for _, p := range pts[first:] {
		s.hist.pushLocked(p)
	}
	return nil
}

// seedSpend fills each rebuilt point's cumulative spend per tenant: the
// tenant's total now less what the rows after the point cost.
func (s *Server) seedSpend(ctx context.Context, pts []HistoryPoint, spent []map[string]int64) {
	ts, err := s.store.Tenants(ctx)
	if err != nil {
		return
	}
	totals, err := s.gate.TenantTotals(ctx)
	if err != nil {
		return
	}
	now := map[string]int64{}
	for i, t := range ts {
		if i == historyTenants {
			break
		}
		now[t.Name] = totals[t.ID].Spent.Micros
	}
	for i := len(pts) - 1; i >= 0; i-- {
		for name, micros := range now {
			pts[i].TenantSpentUSD[name] = float64(micros) / 1e6
		}
		for name, c := range spent[i] {
			if _, ok := now[name]; ok {
				now[name] -= c
			}
		}
	}
}

// observe adds one observation of v seconds to cumulative buckets of the
// TTFT histogram's layout (made on first use).
func observe(bs []bucket, v float64) []bucket {
	if bs == nil {
		bs = make([]bucket, len(latencyBuckets)+1)
		for i, le := range latencyBuckets {
			bs[i].le = le
		}
		bs[len(latencyBuckets)].le = math.Inf(1)
	}
	for i := range bs {
		if v <= bs[i].le {
			bs[i].count++
		}
	}
	return bs
}
