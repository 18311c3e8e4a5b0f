package gateway

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/server/slo"
)

// TestSLOConfigFileThenFlags: the file's slo key overlays the defaults stage
// by stage, --slo wins over the file, a model's slo key overrides its
// stages only, and sources come from the file and the flags.
func TestSLOConfigFileThenFlags(t *testing.T) {
	file := `
slo:
  stream:
    ttft: {p95: 300ms, p99: 500ms}
    engine_ttft: {p95: 200ms}
  json:
    total: {p99: 8s}
sources:
  labels: [eu]
  cidrs: {10.1.0.0/16: lab}
models:
  big:
    slo:
      stream:
        ttft: {p95: 900ms}
`
	st, err := resolveGateway(t, file, "--slo", "stream.engine_ttft=p95:250ms", "--slo", "stream.network=off",
		"--source-labels", "us, ap", "--source-cidr", "192.168.0.0/16=home")
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.srvCfg.SLO
	budgets := func(model string) map[string]time.Duration {
		m := map[string]time.Duration{}
		for _, o := range cfg.Objectives(model) {
			m[string(o.Kind)+"."+o.Stage+"."+o.Name] = o.Budget
		}
		return m
	}
	def := budgets("small")
	for k, want := range map[string]time.Duration{
		"stream.ttft.p95": 300 * time.Millisecond, "stream.ttft.p99": 500 * time.Millisecond, // the file
		"stream.engine_ttft.p95": 250 * time.Millisecond, // the flag over the file
		"stream.gateway.p99":     25 * time.Millisecond,  // the default, untouched
		"json.total.p99":         8 * time.Second,
	} {
		if def[k] != want {
			t.Errorf("default %s = %v, want %v (all: %v)", k, def[k], want, def)
		}
	}
	for _, gone := range []string{"stream.network.p99", "json.total.p95"} {
		if _, ok := def[gone]; ok {
			t.Errorf("default still has %s", gone)
		}
	}
	big := budgets("big")
	if big["stream.ttft.p95"] != 900*time.Millisecond || big["stream.engine_ttft.p95"] != 250*time.Millisecond {
		t.Errorf("big: %v", big)
	}
	if _, ok := big["stream.ttft.p99"]; ok {
		t.Errorf("big's ttft budget replaces the default's stage whole: %v", big)
	}
	src, err := slo.NewSources(cfg.Sources)
	if err != nil {
		t.Fatal(err)
	}
	for h, want := range map[[2]string]string{
		{"us", ""}: "us", {"ap", ""}: "ap", {"eu", ""}: "eu", {"", "10.1.0.9:1"}: "lab", {"", "192.168.3.3:1"}: "home", {"xx", ""}: "other",
	} {
		if got := src.Label(h[0], h[1]); got != want {
			t.Errorf("Label(%q, %q) = %q, want %q", h[0], h[1], got, want)
		}
	}
}

func TestSLOConfigErrorsNameTheFlagOrKey(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		args       []string
		want       string
	}{
		{"flag without percentile", "", []string{"--slo", "stream.ttft=400ms"}, `--slo "stream.ttft=400ms": "400ms": want pNN:DURATION`},
		{"flag unknown kind", "", []string{"--slo", "grpc.ttft=p95:1s"}, "--slo"},
		{"file unknown stage", "slo:\n  stream:\n    prefill: {p95: 1s}\n", nil, "slo (or --slo): stream.prefill: unknown stage"},
		{"file json ttft", "slo:\n  json:\n    ttft: {p95: 1s}\n", nil, "json.ttft: a JSON answer arrives whole"},
		{"model bad percentile", "models:\n  m:\n    slo:\n      stream:\n        ttft: {p100: 1s}\n", nil, "models.m.slo.stream.ttft.p100"},
		{"model zero budget", "models:\n  m:\n    slo:\n      stream:\n        ttft: {p95: 0s}\n", nil, "models.m.slo.stream.ttft.p95: 0s: want a positive duration"},
		{"bad source label", "", []string{"--source-labels", "EU West"}, `sources.labels "EU West"`},
		{"bad cidr flag", "", []string{"--source-cidr", "10.0.0.0/8"}, `--source-cidr "10.0.0.0/8": want CIDR=LABEL`},
		{"bad cidr in file", "sources:\n  cidrs: {10.0.0.0/40: eu}\n", nil, `sources.cidrs "10.0.0.0/40"`},
		{"unknown key in file", "slo:\n  streams: {}\n", nil, "slo.streams: unknown key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := resolveGateway(t, tc.file, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestREADMESLOExampleIsTrue: the README's slo example is a valid config.
func TestREADMESLOExampleIsTrue(t *testing.T) {
	raw, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	y := regexp.MustCompile("(?s)```yaml\n(# slo part of a gateway.yaml\n.*?)```").FindSubmatch(raw)
	if y == nil {
		t.Fatal("no slo example in the README")
	}
	st, err := resolveGateway(t, string(y[1]))
	if err != nil {
		t.Fatalf("the README's slo example: %v", err)
	}
	if objs := st.srvCfg.SLO.Objectives("meta-llama/Llama-3.1-70B-Instruct"); len(objs) == 0 || objs[len(objs)-1].Kind != slo.JSON {
		t.Errorf("objectives %+v", objs)
	}
}
