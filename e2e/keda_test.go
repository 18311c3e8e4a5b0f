package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// kedaModel is the model deploy/kubernetes names; the test's sim serves
// tailgate-sim, put in its place in the query.
const kedaModel = "meta-llama/Llama-3.1-8B-Instruct"

// TestKEDAScalesFromZero walks docs/deploying.md's "KEDA from zero": a
// gateway run as deploy/kubernetes runs it (--autoscaled-models, no fleet
// controller) with its last worker gone holds a request for the model
// instead of answering 503 no_replica; the ScaledObject's query, evaluated
// by promtool over the series the gateway exports at that moment, is above
// its activationThreshold (KEDA scales 0 → 1); the new worker registers and
// the held request is answered.
func TestKEDAScalesFromZero(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	query, activation := kedaTrigger(t)
	gatewayArgs := kubernetesGatewayArgs(t)
	models := ""
	for i, a := range gatewayArgs {
		if a == "--autoscaled-models" && i+1 < len(gatewayArgs) {
			models = gatewayArgs[i+1]
		}
	}
	if !strings.Contains(models, kedaModel) {
		t.Fatalf("deploy/kubernetes/tailgate.yaml runs the gateway with %q: want --autoscaled-models naming %s, or KEDA's first request is refused at zero", gatewayArgs, kedaModel)
	}

	g := startGateway(t, "--autoscaled-models", "*", "--hold-timeout", "2m")
	w1 := g.startFleet(1)[0]
	ctx := context.Background()
	if code, _, body, err := g.chat(ctx, false, 3); err != nil || code != 200 {
		t.Fatalf("with a worker: %d %s %v", code, body, err)
	}
	// KEDA scales the worker Deployment to zero after its cooldown.
	if err := w1.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testkit.WaitWithin(t, 30*time.Second, "w1 gone", func() bool { s := g.state("w1"); return s == "lost" || s == "draining" })
	_ = w1.Wait()

	type answer struct {
		code int
		body string
		err  error
	}
	held := make(chan answer, 1)
	go func() {
		code, _, body, err := g.chat(ctx, false, 3)
		held <- answer{code, body, err}
	}()
	testkit.WaitWithin(t, 30*time.Second, "the request held", func() bool {
		select {
		case a := <-held:
			t.Fatalf("at zero replicas the request was answered at once: %d %s %v", a.code, a.body, a.err)
		default:
		}
		return g.metric(`tailgate_model_waiting_requests{model="tailgate-sim"}`) == 1
	})

	// What KEDA's Prometheus reads now, and what the query makes of it.
	value := evalWithPromtool(t, scrape(t, g), strings.ReplaceAll(query, kedaModel, "tailgate-sim"))
	if value <= activation {
		t.Fatalf("the ScaledObject's query is %v with a request held, not above its activationThreshold %v: KEDA stays at zero", value, activation)
	}

	// KEDA starts a worker pod: a new replica id, and the held request goes.
	g.startWorker("w2")
	select {
	case a := <-held:
		if a.err != nil || a.code != 200 {
			t.Fatalf("the held request: %d %s %v", a.code, a.body, a.err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the held request was not answered within 60s of the new worker starting")
	}
	if n := g.metric(`tailgate_model_waiting_requests{model="tailgate-sim"}`); n != 0 {
		t.Errorf("waiting requests after the worker came: %v", n)
	}
}

// kedaTrigger returns the ScaledObject's Prometheus query and its
// activationThreshold.
func kedaTrigger(t *testing.T) (string, float64) {
	t.Helper()
	raw, err := os.ReadFile("../deploy/kubernetes/autoscaling-keda.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var d struct {
			Kind string `yaml:"kind"`
			Spec struct {
				Triggers []struct {
					Metadata map[string]string `yaml:"metadata"`
				} `yaml:"triggers"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if d.Kind == "ScaledObject" && len(d.Spec.Triggers) == 1 {
			m := d.Spec.Triggers[0].Metadata
			a, err := strconv.ParseFloat(m["activationThreshold"], 64)
			if err != nil {
				t.Fatalf("activationThreshold %q: %v", m["activationThreshold"], err)
			}
			return m["query"], a
		}
	}
	t.Fatal("no ScaledObject with one trigger in autoscaling-keda.yaml")
	return "", 0
}

// kubernetesGatewayArgs returns the gateway container's args in
// deploy/kubernetes/tailgate.yaml.
func kubernetesGatewayArgs(t *testing.T) []string {
	t.Helper()
	for _, o := range readK8s(t) {
		if o.Kind != "Deployment" || o.Metadata.Name != "tailgate-gateway" {
			continue
		}
		for _, c := range o.Spec.Template.Spec.Containers {
			if c.Name == "gateway" {
				return c.Args
			}
		}
	}
	t.Fatal("no gateway container in tailgate.yaml")
	return nil
}

// scrape returns the gateway's /metrics text.
func scrape(t *testing.T, g *gatewayProcess) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, g.admin+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+g.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return string(raw)
}

// evalWithPromtool evaluates query over the tailgate_model_* series of
// exposition (as Prometheus would have scraped them for a while) with
// `promtool test rules`, and returns its one value.
func evalWithPromtool(t *testing.T, exposition, query string) float64 {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install Debian's prometheus package (scripts/test.sh does)")
	}
	var series strings.Builder
	for _, line := range strings.Split(exposition, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || !strings.HasPrefix(f[0], "tailgate_model_") {
			continue
		}
		fmt.Fprintf(&series, "      - series: '%s'\n        values: '%sx5'\n", f[0], f[1])
	}
	// promtool prints the value it got when it differs from the one
	// expected: ask for an impossible one and read the answer.
	dir := t.TempDir()
	rules := filepath.Join(dir, "none.yaml")
	if err := os.WriteFile(rules, []byte("groups: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	test := fmt.Sprintf(`rule_files: [none.yaml]
tests:
  - interval: 1m
    input_series:
%s    promql_expr_test:
      - expr: %q
        eval_time: 2m
        exp_samples: [{labels: '{}', value: -12345}]
`, series.String(), query)
	tf := filepath.Join(dir, "query.test.yaml")
	if err := os.WriteFile(tf, []byte(test), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool, "test", "rules", tf)
	cmd.Dir = dir
	out, _ := cmd.CombinedOutput()
	m := promGot.FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("promtool gave no value for %s:\n%s\n%s", query, out, test)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// promGot reads the value promtool reports under "got:" for a query whose
// result has no labels.
var promGot = regexp.MustCompile(`got:\s*\{\}\s*(\S+)`)
