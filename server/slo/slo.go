// Package slo holds tailgate's latency budgets and evaluates them: per
// model, kind of answer (stream or JSON) and stage, the share of requests
// that finished the stage within its budget, and how fast each objective
// burns its error budget over short and long windows.
//
// # Overview
//
// A [Config] says, for every stage of a request (the ledger's stage names:
// gateway, network, engine_queue, engine_ttft, ttft, total, …), which
// percentile must stay under which duration — "p95 of streamed TTFT within
// 400 ms" — by default and per model. Streams and JSON answers are kept
// apart: a JSON answer arrives whole, so its end-to-end time is "total",
// never TTFT.
//
// An [Evaluator] is fed each finished request ([Evaluator.Observe]: a few
// atomic adds into per-second rings) and evaluates on demand: the JSON rows
// of the admin API ([Evaluator.Evaluate]) and Prometheus gauges computed at
// scrape time ([Evaluator.Collector]). Burn rates follow the multi-window,
// multi-burn-rate alerts of Google's SRE workbook: an objective pages when
// both its 1h and 5m burn rates exceed 14.4, and opens a ticket when both
// its 6h and 30m rates exceed 6.
//
// [Sources] folds a request's source (a header or a CIDR map) into a
// bounded set of labels, so one global percentile cannot hide a slow
// geography.
//
// The package keeps no request, tenant or key: labels are model, stage,
// kind, objective, source and window, all bounded by configuration.
package slo

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tailgate-dev/tailgate/data"
)

// Kind says how an answer was delivered: as a stream (its first token is
// TTFT) or whole, as JSON (its end-to-end time is the whole answer).
type Kind string

const (
	Stream Kind = "stream"
	JSON   Kind = "json"
)

// Kinds lists the kinds in report order.
var Kinds = []Kind{Stream, JSON}

// Percentiles maps a percentile ("p95", "p99", "p99.9") to the longest a
// stage may take at it.
type Percentiles map[string]time.Duration

// Budgets are the latency budgets of one model (or the default): per kind,
// per stage, per percentile. A stage given replaces that stage's budgets of
// the default; a stage given empty drops them.
type Budgets struct {
	Stream map[string]Percentiles `yaml:"stream" json:"stream,omitempty"`
	JSON   map[string]Percentiles `yaml:"json" json:"json,omitempty"`
}

func (b Budgets) kind(k Kind) map[string]Percentiles {
	if k == Stream {
		return b.Stream
	}
	return b.JSON
}

// Set puts one stage's budgets of kind k in b (empty p drops the stage).
func (b *Budgets) Set(k Kind, stage string, p Percentiles) {
	m := &b.JSON
	if k == Stream {
		m = &b.Stream
	}
	if *m == nil {
		*m = map[string]Percentiles{}
	}
	(*m)[stage] = p
}

// DefaultBudgets fit the simulated engine out of the box (median TTFT
// 150 ms, 15 ms per token) and DESIGN's envelope: streamed TTFT p95 400 ms,
// p99 600 ms, split into stage budgets. A JSON answer's total depends on
// its length; its budget is loose.
func DefaultBudgets() Budgets {
	return Budgets{
		Stream: map[string]Percentiles{
			data.StageTTFT:        {"p95": 400 * time.Millisecond, "p99": 600 * time.Millisecond},
			data.StageGateway:     {"p99": 25 * time.Millisecond},
			data.StageNetwork:     {"p99": 50 * time.Millisecond},
			data.StageEngineQueue: {"p95": 100 * time.Millisecond},
			data.StageEngineTTFT:  {"p95": 350 * time.Millisecond},
		},
		JSON: map[string]Percentiles{
			data.StageTotal:   {"p95": 5 * time.Second, "p99": 10 * time.Second},
			data.StageGateway: {"p99": 25 * time.Millisecond},
		},
	}
}

// Objective is one budget: Target (e.g. 0.95) of the requests of Kind finish
// Stage within Budget. Name is the percentile it was given as ("p95").
type Objective struct {
	Kind   Kind
	Stage  string
	Name   string
	Target float64
	Budget time.Duration
}

// Config is what the gateway holds requests to.
type Config struct {
	// Default applies to every model; nil means [DefaultBudgets].
	Default *Budgets
	// Models overrides Default stage by stage for the models named.
	Models map[string]Budgets
	// Sources labels requests by where they come from; its zero value
	// labels none (every request is "default").
	Sources SourceConfig
}

// Validate reports the first budget that cannot work.
func (c *Config) Validate() error {
	if c.Default != nil {
		if err := c.Default.Validate(); err != nil {
			return err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Models)) {
		b := c.Models[name]
		if err := b.Validate(); err != nil {
			return fmt.Errorf("model %s: %w", name, err)
		}
	}
	return c.Sources.Validate()
}

// Validate checks every stage name, percentile and duration of b.
func (b *Budgets) Validate() error {
	for _, k := range Kinds {
		m := b.kind(k)
		for _, stage := range slices.Sorted(maps.Keys(m)) {
			if !slices.Contains(data.StageNames[:], stage) {
				return fmt.Errorf("%s.%s: unknown stage (want one of %s)", k, stage, strings.Join(data.StageNames[:], ", "))
			}
			if k == JSON && (stage == data.StageTTFT) {
				return fmt.Errorf("json.%s: a JSON answer arrives whole, it has no time to first token; budget its total", stage)
			}
			for _, p := range slices.Sorted(maps.Keys(m[stage])) {
				if _, err := ParsePercentile(p); err != nil {
					return fmt.Errorf("%s.%s.%s: %w", k, stage, p, err)
				}
				if d := m[stage][p]; d <= 0 {
					return fmt.Errorf("%s.%s.%s: %v: want a positive duration, e.g. 400ms", k, stage, p, d)
				}
			}
		}
	}
	return nil
}

// ParsePercentile reads "p95" or "p99.9" as 0.95 or 0.999.
func ParsePercentile(p string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimPrefix(p, "p"), 64)
	if !strings.HasPrefix(p, "p") || err != nil || v <= 0 || v >= 100 {
		return 0, errors.New("want a percentile such as p50, p95, p99 or p99.9")
	}
	return v / 100, nil
}

// Objectives returns the objectives that hold for model, in a stable order
// (kind, stage in path order, target).
func (c *Config) Objectives(model string) []Objective {
	def := DefaultBudgets()
	if c.Default != nil {
		def = *c.Default
	}
	var out []Objective
	for _, k := range Kinds {
		merged := maps.Clone(def.kind(k))
		if merged == nil {
			merged = map[string]Percentiles{}
		}
		maps.Copy(merged, c.Models[model].kind(k))
		for _, stage := range data.StageNames {
			for p, d := range merged[stage] {
				t, err := ParsePercentile(p)
				if err != nil || d <= 0 {
					continue // Validate refuses it
				}
				out = append(out, Objective{Kind: k, Stage: stage, Name: p, Target: t, Budget: d})
			}
		}
	}
	slices.SortStableFunc(out, func(a, b Objective) int {
		if a.Kind != b.Kind {
			return slices.Index(Kinds, a.Kind) - slices.Index(Kinds, b.Kind)
		}
		if a.Stage != b.Stage {
			return stageIndex(a.Stage) - stageIndex(b.Stage)
		}
		switch {
		case a.Target < b.Target:
			return -1
		case a.Target > b.Target:
			return 1
		}
		return 0
	})
	return out
}

func stageIndex(name string) int { return slices.Index(data.StageNames[:], name) }

// ParseFlag reads one --slo flag value, KIND.STAGE=pNN:DUR[,pNN:DUR] (e.g.
// stream.engine_ttft=p95:300ms,p99:500ms), into b. A stage given with
// "off" (stream.network=off) is dropped.
func (b *Budgets) ParseFlag(v string) error {
	key, val, ok := strings.Cut(v, "=")
	kind, stage, ok2 := strings.Cut(key, ".")
	if !ok || !ok2 || (Kind(kind) != Stream && Kind(kind) != JSON) {
		return fmt.Errorf("%q: want KIND.STAGE=pNN:DURATION[,pNN:DURATION] with KIND stream or json, e.g. stream.ttft=p95:400ms,p99:600ms", v)
	}
	p := Percentiles{}
	if val != "off" {
		for part := range strings.SplitSeq(val, ",") {
			name, ds, ok := strings.Cut(part, ":")
			d, err := time.ParseDuration(ds)
			if !ok || err != nil {
				return fmt.Errorf("%q: %q: want pNN:DURATION, e.g. p95:400ms", v, part)
			}
			p[name] = d
		}
	}
	nb := Budgets{}
	nb.Set(Kind(kind), stage, p)
	if err := nb.Validate(); err != nil {
		return err
	}
	b.Set(Kind(kind), stage, p)
	return nil
}
