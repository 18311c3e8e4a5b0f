package router

import (
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // part of the error; "" for a valid config
	}{
		{"the zero value is valid", Config{}, ""},
		{"a retry budget ratio of 1 is valid", Config{Budget: BudgetConfig{Ratio: 1}}, ""},
		{"a retry budget ratio above 1 is refused", Config{Budget: BudgetConfig{Ratio: 1.5}}, "retry budget ratio 1.5: want a fraction between 0 and 1"},
		{"a negative retry budget ratio is refused", Config{Budget: BudgetConfig{Ratio: -0.1}}, "retry budget ratio -0.1"},
		{"a negative budget burst is refused", Config{Budget: BudgetConfig{Burst: -1}}, "must not be negative"},
		{"a negative slow start is refused", Config{SlowStart: -time.Second}, "slow start -1s"},
		{"negative max attempts are refused", Config{MaxAttempts: -1}, "max attempts -1"},
		{"a hedge percentile of 1 is refused", Config{Hedge: HedgeConfig{Percentile: 1}}, "hedge percentile"},
		{"a hedge budget above 1 is refused", Config{Hedge: HedgeConfig{Budget: 10}}, "hedge budget 10: want a fraction of requests between 0 and 1"},
		{"a model's negative hedge burst is refused", Config{Hedge: HedgeConfig{Models: map[string]HedgeModel{"m": {Burst: -1}}}}, "hedge burst of m -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error containing %q", err, tc.want)
			}
			if _, nerr := New(tc.cfg, nil); nerr == nil {
				t.Fatal("New accepted what Validate refuses")
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{}.withDefaults()
	if c.MaxAttempts != 3 || c.Rand == nil || c.Now == nil || c.SlowStart != 0 || c.Affinity != AffinityOff || c.Hedge.Enabled {
		t.Fatalf("zero Config with defaults: %+v", c)
	}
	if c.Budget.Ratio != 0.05 || c.Budget.Burst != 50 || c.Hedge.Percentile != 0.95 || c.Hedge.Budget != 0.10 || c.Hedge.Burst != 20 {
		t.Fatalf("zero budget/hedge with defaults: %+v %+v", c.Budget, c.Hedge)
	}
}
