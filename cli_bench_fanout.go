package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/tailgate-dev/tailgate/bench/load"
)

// registerFanout binds the fan-out scenario's and the hedge sweep's flags
// to o.
func registerFanout(fs *flag.FlagSet, o *load.FanoutOptions) {
	fs.BoolVar(&o.Sweep, "sweep-hedge", false, "run the hedge threshold procedure: the same seeded fan-out without hedging and at each --sweep-percentiles × --sweep-budgets, then the trade-off table and the recommended setting (with --target: the deployment's own setting against x-tailgate-hedge: off)")
	fs.IntVar(&o.Docs, "docs", 0, "fanout: documents per arm (default 300)")
	fs.Func("parts", "fanout: parts per document, MIN-MAX (default 4-8)", func(s string) error {
		lo, hi, ok := strings.Cut(s, "-")
		var err1, err2 error
		o.MinParts, err1 = strconv.Atoi(lo)
		o.MaxParts, err2 = strconv.Atoi(hi)
		if !ok || err1 != nil || err2 != nil {
			return fmt.Errorf("want MIN-MAX, e.g. 4-8")
		}
		return nil
	})
	fs.Float64Var(&o.DocRate, "doc-rate", 0, "fanout: documents started per second (default 6)")
	fs.IntVar(&o.WarmParts, "warm-parts", 0, "fanout: parts sent to each fresh gateway before measuring, so its hedge delay is learnt (default 240; it needs 50)")
	fs.Func("modes", "fanout: how parts are sent, a list of stream, json, batch (default all three)", func(s string) error {
		o.Modes = strings.Split(s, ",")
		return nil
	})
	fs.Func("seeds", "fanout: run these seeds one after another, e.g. 1,2,3 (default --seed)", func(s string) error {
		o.Seeds = nil
		for f := range strings.SplitSeq(s, ",") {
			v, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
			if err != nil {
				return fmt.Errorf("want seeds like 1,2,3")
			}
			o.Seeds = append(o.Seeds, v)
		}
		return nil
	})
	floats := func(into *[]float64) func(string) error {
		return func(s string) error {
			*into = nil
			for f := range strings.SplitSeq(s, ",") {
				v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
				if err != nil {
					return fmt.Errorf("want numbers like 0.9,0.95")
				}
				*into = append(*into, v)
			}
			return nil
		}
	}
	fs.Func("sweep-percentiles", "sweep: hedge percentiles tried (default 0.8,0.9,0.95,0.99)", floats(&o.Percentiles))
	fs.Func("sweep-budgets", "sweep: hedge budgets tried (default 0.05,0.10,0.15)", floats(&o.Budgets))
}

// registerPriority binds the priority scenario's flags to o.
func registerPriority(fs *flag.FlagSet, o *load.PriorityOptions) {
	fs.IntVar(&o.Lines, "batch-lines", 0, "priority: lines of the Batch API job run beside interactive traffic (default 2000)")
	fs.DurationVar(&o.Duration, "priority-duration", 0, "priority: how long interactive traffic (--rate, default 20/s) runs alone and then beside the batch (default 30s)")
	fs.Float64Var(&o.MaxRatio, "max-ratio", 0, "priority: highest interactive p99 beside the batch over p99 alone that passes; exit status 1 above it (default 1.2)")
}
