package gateway

import (
	"flag"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/tailgate-dev/tailgate/server/slo"
)

// sloConfig is the latency-budget part of Config: the file's slo and
// sources keys, a model's slo key, and the --slo and --source-* flags.
//
//	slo:                     # over slo.DefaultBudgets, stage by stage
//	  stream:
//	    ttft: {p95: 400ms, p99: 600ms}
//	    engine_ttft: {p95: 300ms}
//	  json:
//	    total: {p99: 8s}
//	sources:
//	  labels: [eu, us]
//	  cidrs: {10.1.0.0/16: eu}
//	models:
//	  llama-70b:
//	    slo: {stream: {ttft: {p95: 900ms}}}
type sloConfig struct {
	SLO     slo.Budgets      `yaml:"slo"`     // the default budgets, over slo.DefaultBudgets; --slo wins
	Sources slo.SourceConfig `yaml:"sources"` // --source-labels and --source-cidr add

	sloFlags, sourceCIDRFlags []string
	sourceLabels              string
}

func (c *sloConfig) register(fs *flag.FlagSet) {
	fs.Func("slo", "latency budget of a stage, KIND.STAGE=pNN:DURATION[,pNN:DURATION] with KIND stream or json, e.g. stream.ttft=p95:400ms,p99:600ms or stream.network=off (repeatable; over the defaults and the config file's slo key)", appendTo(&c.sloFlags))
	fs.StringVar(&c.sourceLabels, "source-labels", "", "request sources the x-tailgate-source header may name, comma-separated (others fold into \"other\"; at most 16 labels)")
	fs.Func("source-cidr", "label requests from a client network, CIDR=LABEL, e.g. 10.1.0.0/16=eu (repeatable)", appendTo(&c.sourceCIDRFlags))
}

// load puts the flags over the file's keys.
func (c *sloConfig) load() error {
	for _, v := range c.sloFlags {
		if err := c.SLO.ParseFlag(v); err != nil {
			return fmt.Errorf("--slo %w", err)
		}
	}
	c.sloFlags = nil
	for l := range strings.SplitSeq(c.sourceLabels, ",") {
		if l = strings.TrimSpace(l); l != "" {
			c.Sources.Labels = append(c.Sources.Labels, l)
		}
	}
	c.sourceLabels = ""
	for _, v := range c.sourceCIDRFlags {
		cidr, label, ok := strings.Cut(v, "=")
		if !ok || cidr == "" || label == "" {
			return fmt.Errorf("--source-cidr %q: want CIDR=LABEL, e.g. 10.1.0.0/16=eu", v)
		}
		if c.Sources.CIDRs == nil {
			c.Sources.CIDRs = map[string]string{}
		}
		c.Sources.CIDRs[cidr] = label
	}
	c.sourceCIDRFlags = nil
	return nil
}

// config is the evaluator's configuration: the defaults overlaid with the
// file's and the flags' budgets, and each model's own.
func (c *sloConfig) config(models map[string]ModelConfig) slo.Config {
	def := slo.DefaultBudgets()
	for _, k := range slo.Kinds {
		src := c.SLO.Stream
		if k == slo.JSON {
			src = c.SLO.JSON
		}
		for stage, p := range src {
			def.Set(k, stage, p)
		}
	}
	cfg := slo.Config{Default: &def, Sources: c.Sources, Models: map[string]slo.Budgets{}}
	for name, m := range models {
		if m.SLO != nil {
			cfg.Models[name] = *m.SLO
		}
	}
	return cfg
}

// validate names the key or flag at fault.
func (c *sloConfig) validate(models map[string]ModelConfig) error {
	if err := c.SLO.Validate(); err != nil {
		return fmt.Errorf("slo (or --slo): %w", err)
	}
	if err := c.Sources.Validate(); err != nil {
		return fmt.Errorf("%w (config key sources, or --source-labels, --source-cidr)", err)
	}
	for _, name := range slices.Sorted(maps.Keys(models)) {
		if m := models[name]; m.SLO != nil {
			if err := m.SLO.Validate(); err != nil {
				return fmt.Errorf("models.%s.slo.%w", name, err)
			}
		}
	}
	return nil
}

// LoadSLO reads the latency budgets of a gateway config file (its slo,
// sources and models.NAME.slo keys over the defaults) as the gateway reads
// them; the bench command holds its results against them.
func LoadSLO(raw []byte) (slo.Config, error) {
	var c Config
	if err := decodeYAML(raw, &c); err != nil {
		return slo.Config{}, err
	}
	if err := c.sloConfig.validate(c.Models); err != nil {
		return slo.Config{}, err
	}
	return c.sloConfig.config(c.Models), nil
}
