package e2e

import (
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const (
	alertRules     = "../deploy/prometheus/tailgate-alerts.yaml"
	alertRuleTests = "../deploy/prometheus/tailgate-alerts.test.yaml"
)

// promRule is a rule of a Prometheus rule file: an alert, or a recording
// rule (Alert "").
type promRule struct {
	Alert string `yaml:"alert"`
	Expr  string `yaml:"expr"`
}

// promRules returns every rule of a Prometheus rule file, in order.
func promRules(t *testing.T, path string) []promRule {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []promRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	var out []promRule
	for _, g := range rules.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

// ruleAlerts returns the alert names of a Prometheus rule file, with their
// expressions.
func ruleAlerts(t *testing.T, path string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, r := range promRules(t, path) {
		if r.Alert != "" {
			out[r.Alert] = r.Expr
		}
	}
	return out
}

// TestAlertRulesPassPromtool: the shipped alert rules load in Prometheus
// (`promtool check rules`) and their unit tests pass (`promtool test
// rules`): each alert fires on the series a gateway exports in the outage
// it is for — a dead worker, every replica gone, a stopped gateway, 5xx
// answers, a ledger that cannot write, a TTFT budget burning — and every
// alert has a case that expects it to fire.
func TestAlertRulesPassPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install Debian's prometheus package (scripts/test.sh does)")
	}
	for _, args := range [][]string{{"check", "rules", alertRules}, {"test", "rules", alertRuleTests}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	raw, err := os.ReadFile(alertRuleTests)
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(raw, &tests); err != nil {
		t.Fatal(err)
	}
	fires := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			fires[a.Alertname] = fires[a.Alertname] || len(a.ExpAlerts) > 0
		}
	}
	alerts := ruleAlerts(t, alertRules)
	for _, name := range slices.Sorted(maps.Keys(alerts)) {
		if !fires[name] {
			t.Errorf("alert %s has no case in %s that expects it to fire", name, alertRuleTests)
		}
	}
	// The outages an operator must hear about each have their alert.
	for _, name := range []string{"TailgateGatewayDown", "TailgateGatewayAbsent", "TailgateModelNoReadyReplica", "TailgateNoReadyReplica",
		"TailgateReplicaLost", "TailgateReplicaOut", "TailgateServerErrors", "TailgateLedgerUnavailable", "TailgateTTFTBudgetBurn"} {
		if alerts[name] == "" {
			t.Errorf("no alert %s in %s", name, alertRules)
		}
	}
}
