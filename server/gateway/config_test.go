package gateway

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
)

// resolveGateway parses args as `tailgate gateway` does, with file as the
// --config file when it is not empty.
func resolveGateway(t *testing.T, file string, args ...string) (*parts, error) {
	t.Helper()
	if file != "" {
		path := filepath.Join(t.TempDir(), "gateway.yaml")
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"--config", path}, args...)
	}
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var cfg Config
	cfg.RegisterFlags(fs)
	cfg.RegisterMeshFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := cfg.Load(fs); err != nil {
		return nil, err
	}
	return cfg.setup()
}

func TestGatewayConfigErrorsNameTheFlagOrKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		file string
		args []string
		want string
	}{
		{"flag not a number", "", []string{"--max-body", "4MB"}, "-max-body"},
		{"flag not a duration", "", []string{"--ttft-deadline", "30"}, "-ttft-deadline"},
		{"negative body size", "", []string{"--max-body", "-1"}, "--max-body -1"},
		{"negative max tokens", "", []string{"--default-max-tokens", "-5"}, "--default-max-tokens"},
		{"negative duration", "", []string{"--idle-deadline", "-1s"}, "--idle-deadline -1s"},
		{"negative grace", "", []string{"--shutdown-grace", "-1s"}, "--shutdown-grace"},
		{"negative forget-lost", "", []string{"--forget-lost", "-1h"}, "--forget-lost -1h0m0s: want a positive duration"},
		{"otlp endpoint without scheme", "", []string{"--otlp-endpoint", "collector:4318"}, `--otlp-endpoint "collector:4318": want the collector's OTLP/HTTP URL`},
		{"otlp sample ratio in percent", "", []string{"--otlp-endpoint", "http://127.0.0.1:4318", "--otlp-sample-ratio", "10"}, "--otlp-sample-ratio 10: want a share between 0 and 1"},
		{"negative slow start", "", []string{"--slow-start", "-1s"}, "--slow-start -1s: router:"},
		{"retry budget above 1", "", []string{"--retry-budget", "5"}, "--retry-budget 5: router:"},
		{"hedge percentile given in percent", "", []string{"--hedge-percentile", "95"}, "--hedge-percentile 95"},
		{"hedge min above max", "", []string{"--hedge-min", "2s", "--hedge-max", "1s"}, "--hedge-min, --hedge-max [2s 1s]: router:"},
		{"unknown policy", "", []string{"--policy", "fastest"}, `--policy: router: unknown selection policy "fastest"`},
		{"valid: round robin, half the budget, hedging", "", []string{"--policy", "round-robin", "--retry-budget", "0.5", "--hedge"}, ""},
		{"listen without port", "", []string{"--listen", "localhost"}, `--listen "localhost"`},
		{"upstream flag not a URL", "", []string{"--upstream", "10.0.0.5:8000"}, `--upstream "10.0.0.5:8000"`},
		{"price flag without output", "", []string{"--price", "llama=0.2"}, `--price "llama=0.2"`},
		{"negative price flag", "", []string{"--price", "llama=-1,2"}, `--price "llama=-1,2"`},
		{"allow list without mesh", "", []string{"--mesh-allow-peers", "tg-w1"}, "--mesh-allow-peers needs --mesh"},
		{"funnel without mesh", "", []string{"--mesh-funnel"}, "--mesh-funnel needs --mesh"},
		{"file upstream not a URL", "upstreams:\n  - url: gpu-a:8000\n", nil, `upstreams[0].url "gpu-a:8000"`},
		{"file max tokens not a number", "models:\n  llama:\n    max_tokens: lots\n", nil, "line 3: models.llama.max_tokens: cannot unmarshal"},
		{"file deadline not a duration", "models:\n  llama:\n    ttft_deadline: soon\n", nil, "line 3: models.llama.ttft_deadline: cannot unmarshal"},
		{"file deadline without unit", "models:\n  llama:\n    ttft_deadline: 20\n", nil, "line 3: models.llama.ttft_deadline: cannot unmarshal !!int `20` into time.Duration"},
		{"file upstream key misspelt", "upstreams:\n  - id: a\n    ulr: http://a:8000\n", nil, "line 3: upstreams[0].ulr: unknown key"},
		{"file key misspelt", "models:\n  llama:\n    max_token: 10\n", nil, "line 3: models.llama.max_token: unknown key"},
		{"file top-level key unknown", "listen: 0.0.0.0:8080\n", nil, "line 1: listen: unknown key"},
		{"file default max tokens negative", "default_max_tokens: -1\n", nil, "default_max_tokens"},
		{"file model max tokens negative", "models:\n  llama:\n    max_tokens: -1\n", nil, "models.llama.max_tokens: -1 is negative"},
		{"file idle deadline negative", "models:\n  llama:\n    idle_deadline: -1s\n", nil, "models.llama.idle_deadline: -1s is negative"},
		{"file price negative", "models:\n  llama:\n    price: {input_per_million: -0.2, output_per_million: 0.6}\n", nil, "models.llama.price:"},
		{"file hedge percentile in percent", "models:\n  llama:\n    hedge: {percentile: 95}\n", nil, "models.llama.hedge.percentile 95: router:"},
		{"hedge budget given in percent", "", []string{"--hedge-budget", "10"}, "--hedge-budget 10: router: hedge budget 10: want a fraction"},
		{"negative hedge burst", "", []string{"--hedge-burst", "-1"}, "--hedge-burst -1: router: hedge burst -1"},
		{"file hedge budget in percent", "models:\n  llama:\n    hedge: {budget: 10}\n", nil, "models.llama.hedge.budget 10: router:"},
		{"file hedge min above max", "models:\n  llama:\n    hedge: {min: 5s, max: 1s}\n", nil, "models.llama.hedge.min, hedge.max 5s, 1s: router:"},
		{"file not YAML", "models: [\n", nil, "--config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := resolveGateway(t, tc.file, tc.args...)
			if tc.want == "" { // a valid row, so the table does not pass by refusing everything
				if err != nil {
					t.Fatalf("err = %v; want none", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v; want it to contain %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines: %q", err)
			}
		})
	}
}

func TestGatewayConfigDefaultsReachEachPackage(t *testing.T) {
	st, err := resolveGateway(t, "")
	if err != nil {
		t.Fatal(err)
	}
	s := st.srvCfg
	if s.DefaultMaxTokens != 1024 || s.MaxBodyBytes != 4<<20 || s.KeepAlive != 10*time.Second ||
		s.TTFTDeadline != 30*time.Second || s.IdleDeadline != 30*time.Second || s.JSONDeadline != 10*time.Minute {
		t.Errorf("server.Config = %+v", s)
	}
	r := st.routerCfg
	if r.Selector != nil || r.Affinity != router.AffinitySession || r.SlowStart != router.DefaultSlowStart || r.ForgetLost != router.DefaultForgetLost || r.Budget.Ratio != 0.05 ||
		!r.Hedge.Enabled || r.Hedge.Percentile != 0.95 || r.Hedge.Min != 20*time.Millisecond || r.Hedge.Max != 30*time.Second ||
		r.Hedge.Budget != 0.10 || r.Hedge.Burst != 20 {
		t.Errorf("router.Config = %+v", r)
	}
	if len(st.upstreams) != 0 || len(st.prices) != 0 {
		t.Errorf("upstreams %v, prices %v; want none", st.upstreams, st.prices)
	}
}

func TestGatewayForgetLostReachesTheRouter(t *testing.T) {
	st, err := resolveGateway(t, "", "--forget-lost", "90m")
	if err != nil {
		t.Fatal(err)
	}
	if st.routerCfg.ForgetLost != 90*time.Minute {
		t.Errorf("--forget-lost 90m gave router ForgetLost %v", st.routerCfg.ForgetLost)
	}
}

func TestGatewayHedgesUnlessTurnedOff(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{{nil, true}, {[]string{"--hedge=false"}, false}, {[]string{"--hedge"}, true}} {
		st, err := resolveGateway(t, "", tc.args...)
		if err != nil {
			t.Fatal(err)
		}
		if st.routerCfg.Hedge.Enabled != tc.want {
			t.Errorf("%v: router hedging on = %v, want %v", tc.args, st.routerCfg.Hedge.Enabled, tc.want)
		}
	}
}

func TestGatewayConfigZeroMeansDefaultOrOff(t *testing.T) {
	st, err := resolveGateway(t, "", "--default-max-tokens", "0", "--max-body", "0", "--ttft-deadline", "0",
		"--retry-budget", "0", "--hedge-percentile", "0", "--slow-start", "0")
	if err != nil {
		t.Fatal(err)
	}
	// Zero reaches the packages, whose zero is their default...
	if st.srvCfg.DefaultMaxTokens != 0 || st.srvCfg.MaxBodyBytes != 0 || st.srvCfg.TTFTDeadline != 0 ||
		st.routerCfg.Budget.Ratio != 0 || st.routerCfg.Hedge.Percentile != 0 {
		t.Errorf("zero flags did not reach the packages as zero: %+v %+v", st.srvCfg, st.routerCfg)
	}
	// ...or, for slow start, off.
	if st.routerCfg.SlowStart != 0 {
		t.Errorf("--slow-start 0 gave router SlowStart %v; want 0 (off)", st.routerCfg.SlowStart)
	}
}

func TestGatewayConfigFileThenFlags(t *testing.T) {
	file := `
upstreams:
  - id: gpu-a
    url: http://10.0.0.5:8000/v1/
  - url: http://10.0.0.6:8000
default_max_tokens: 512
models:
  llama:
    max_tokens: 2048
    ttft_deadline: 20s
    idle_deadline: 10s
    price: {input_per_million: 0.20, output_per_million: 0.60}
    hedge: {enabled: false, percentile: 0.9, min: 50ms, max: 5s, budget: 0.2, burst: 40}
  qwen:
    price: {input_per_million: 1, output_per_million: 2}
`
	t.Run("file alone", func(t *testing.T) {
		st, err := resolveGateway(t, file)
		if err != nil {
			t.Fatal(err)
		}
		wantUp := []upstream{{"gpu-a", "http://10.0.0.5:8000"}, {"10.0.0.6:8000", "http://10.0.0.6:8000"}}
		if !reflect.DeepEqual(st.upstreams, wantUp) {
			t.Errorf("upstreams = %v; want %v", st.upstreams, wantUp)
		}
		s := st.srvCfg
		if s.DefaultMaxTokens != 512 || s.MaxTokensByModel["llama"] != 2048 || s.TTFTDeadlineByModel["llama"] != 20*time.Second ||
			s.IdleDeadlineByModel["llama"] != 10*time.Second || len(s.MaxTokensByModel) != 1 {
			t.Errorf("server.Config = %+v", s)
		}
		wantPrices := map[string]policy.Price{"llama": {InputMicrosPerM: 200_000, OutputMicrosPerM: 600_000},
			"qwen": {InputMicrosPerM: 1_000_000, OutputMicrosPerM: 2_000_000}}
		if !reflect.DeepEqual(st.prices, wantPrices) {
			t.Errorf("prices = %v; want %v", st.prices, wantPrices)
		}
		h, ok := st.routerCfg.Hedge.Models["llama"]
		if !ok || h.Enabled == nil || *h.Enabled || h.Percentile != 0.9 || h.Min != 50*time.Millisecond || h.Max != 5*time.Second ||
			h.Budget != 0.2 || h.Burst != 40 {
			t.Errorf("router hedge for llama = %+v", h)
		}
		if _, ok := st.routerCfg.Hedge.Models["qwen"]; ok {
			t.Errorf("qwen has no hedge entry but got one")
		}
	})
	t.Run("flags win and add", func(t *testing.T) {
		st, err := resolveGateway(t, file, "--default-max-tokens", "64", "--upstream", "http://10.0.0.7:8000",
			"--price", "llama=1,3", "--price", "mistral=0.5,0.5")
		if err != nil {
			t.Fatal(err)
		}
		if st.srvCfg.DefaultMaxTokens != 64 {
			t.Errorf("--default-max-tokens 64 lost to the file: %d", st.srvCfg.DefaultMaxTokens)
		}
		if len(st.upstreams) != 3 || st.upstreams[2] != (upstream{"10.0.0.7:8000", "http://10.0.0.7:8000"}) {
			t.Errorf("--upstream not added after the file's: %v", st.upstreams)
		}
		if st.prices["llama"] != (policy.Price{InputMicrosPerM: 1_000_000, OutputMicrosPerM: 3_000_000}) ||
			st.prices["mistral"] != (policy.Price{InputMicrosPerM: 500_000, OutputMicrosPerM: 500_000}) ||
			st.prices["qwen"] != (policy.Price{InputMicrosPerM: 1_000_000, OutputMicrosPerM: 2_000_000}) {
			t.Errorf("prices = %v", st.prices)
		}
		if st.srvCfg.MaxTokensByModel["llama"] != 2048 {
			t.Errorf("--price for llama dropped the rest of its entry")
		}
	})
}

// TestREADMEGatewayConfigExampleLoads keeps the README's gateway.yaml
// example true: it loads and reaches each package as the text says (the
// root's TestREADMEGatewayConfigIsTrue checks the section's flags).
func TestREADMEGatewayConfigExampleLoads(t *testing.T) {
	raw, err := os.ReadFile("../../docs/commands.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	start := strings.Index(readme, "## `tailgate gateway`")
	end := strings.Index(readme[start+1:], "\n## ")
	if start < 0 || end < 0 {
		t.Fatal("docs/commands.md has no `tailgate gateway` section")
	}
	section := readme[start : start+1+end]

	y := regexp.MustCompile("(?s)```yaml\n(# gateway.yaml\n.*?)```").FindStringSubmatch(section)
	if y == nil {
		t.Fatal("no gateway.yaml example in the README")
	}
	st, err := resolveGateway(t, y[1])
	if err != nil {
		t.Fatalf("the README's gateway.yaml: %v", err)
	}
	const model = "meta-llama/Llama-3.1-8B-Instruct"
	if len(st.upstreams) != 1 || st.srvCfg.MaxTokensByModel[model] != 2048 || st.prices[model].OutputMicrosPerM != 600_000 {
		t.Errorf("the README's gateway.yaml gave upstreams %v, server %+v, prices %v", st.upstreams, st.srvCfg, st.prices)
	}
	if h := st.routerCfg.Hedge.Models[model]; h.Enabled == nil || !*h.Enabled || h.Max != 5*time.Second {
		t.Errorf("the README's gateway.yaml gave hedge %+v", h)
	}
	if err := st.routerCfg.Validate(); err != nil {
		t.Errorf("router.Config from the README's example: %v", err)
	}
}

// TestParseUpstream: the server's root and the base URL OpenAI clients
// take (…/v1, with or without a slash) name the same upstream; an
// endpoint, a query or credentials in the URL are refused.
func TestParseUpstream(t *testing.T) {
	for _, tc := range []struct{ in, base, err string }{
		{"http://10.0.0.5:8000", "http://10.0.0.5:8000", ""},
		{"http://10.0.0.5:8000/", "http://10.0.0.5:8000", ""},
		{"http://10.0.0.5:8000/v1", "http://10.0.0.5:8000", ""},
		{"http://10.0.0.5:8000/v1/", "http://10.0.0.5:8000", ""},
		{"https://gw.example.com/openai/v1", "https://gw.example.com/openai", ""},
		{"http://10.0.0.5:8000/v1/chat/completions", "", "not one of its endpoints"},
		{"http://10.0.0.5:8000/v1/models", "", "not one of its endpoints"},
		{"http://10.0.0.5:8000/v1?x=1", "", "without user, query or fragment"},
		{"http://user:pw@10.0.0.5:8000/v1", "", "without user, query or fragment"},
		{"10.0.0.5:8000", "", "want a base URL"},
	} {
		base, _, err := ParseUpstream(tc.in)
		switch {
		case tc.err == "" && (err != nil || base != tc.base):
			t.Errorf("ParseUpstream(%q) = %q, %v; want %q", tc.in, base, err, tc.base)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseUpstream(%q) = %q, %v; want an error with %q", tc.in, base, err, tc.err)
		}
	}
}

// TestGatewayDatabaseFromFileOrFlag: database comes from the file or
// --database (the flag wins); anything but a PostgreSQL URL is refused,
// naming the flag and never showing the password.
func TestGatewayDatabaseFromFileOrFlag(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		args       []string
		want       string // cfg.Database, or the error's text
		wantErr    bool
	}{
		{"default is SQLite in --data", "", nil, "", false},
		{"file", "database: postgres://gw@db.internal/tailgate\n", nil, "postgres://gw@db.internal/tailgate", false},
		{"flag wins over file", "database: postgres://gw@db.internal/tailgate\n",
			[]string{"--database", "postgresql://gw@other/tg"}, "postgresql://gw@other/tg", false},
		{"not a URL", "", []string{"--database", "/var/lib/tg.db"}, `--database (database) "/var/lib/tg.db"`, true},
		{"other scheme, password hidden", "", []string{"--database", "mysql://gw:hunter2@db/tg"}, "--database (database)", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.file != "" {
				path := filepath.Join(t.TempDir(), "gateway.yaml")
				if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append([]string{"--config", path}, args...)
			}
			fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var cfg Config
			cfg.RegisterFlags(fs)
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			err := cfg.Load(fs)
			switch {
			case tc.wantErr && (err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "hunter2")):
				t.Errorf("error = %v, want one containing %q and no password", err, tc.want)
			case !tc.wantErr && (err != nil || cfg.Database != tc.want):
				t.Errorf("database = %q, %v; want %q", cfg.Database, err, tc.want)
			}
		})
	}
}
