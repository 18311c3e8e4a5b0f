package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestDashboardAndAlertsNameRealMetrics: a gateway that served requests
// (streams, errors, hedges, a replica ejected, a tenant with a budget)
// exposes tailgate_build_info as `version` reports it, and every metric and
// label that the Grafana dashboard's and the alert rules' queries name is
// in its /metrics.
func TestDashboardAndAlertsNameRealMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	// Hedges from the first request on (the delay is clamped to 1–2 ms
	// against a 20 ms time to first token); seeded hangs that the TTFT
	// deadline abandons, which ejects their replica.
	const replicas = 3
	p := startUp(t, "--replicas", fmt.Sprint(replicas), "--sim-ttft", "20ms", "--sim-tpot", "1ms", "--hedge", "--hedge-min", "1ms",
		"--hedge-max", "2ms", "--retry-budget", "1", "--ttft-deadline", "300ms", "--sim-hang-rate", "0.05", "--price", "tailgate-sim=1,2")
	key := testkit.LastLine(tailgate(t, "keys", "create", "--data", p.dir, "--tenant", "team-a", "--budget", "100", "--budget-tokens", "1000000"))
	adminToken := readToken(t, filepath.Join(p.dir, "admin.token"))

	scrape := func() map[string]*dto.MetricFamily {
		req, _ := http.NewRequest(http.MethodGet, p.admin+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return fams
	}
	client := p.client(key)
	bad := p.client("sk-not-a-key")
	ctx := context.Background()
	// Every request bounded, whatever the gateway does with a hung one.
	tctx := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		t.Cleanup(cancel)
		return c
	}
	params := openai.ChatCompletionNewParams{Model: "tailgate-sim", MaxTokens: openai.Int(4),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}}
	needed := []string{"tailgate_hedges_total", "tailgate_ejections_total", "tailgate_tenant_spent_micros_total", "tailgate_ttft_seconds"}
	var fams map[string]*dto.MetricFamily
	ready := func(fams map[string]*dto.MetricFamily) int {
		n := 0
		for _, m := range fams["tailgate_replica_ready"].GetMetric() {
			n += int(m.GetGauge().GetValue())
		}
		return n
	}
	for round := 0; round < 30; round++ {
		// An ejected replica is probed back within about a second: wait
		// for all, so hedges have somewhere to go.
		for wait := 0; wait < 100 && ready(scrape()) < replicas; wait++ {
			time.Sleep(100 * time.Millisecond)
		}
		for i := range 10 {
			if i%2 == 0 {
				if _, err := client.Chat.Completions.New(tctx(), params); err != nil {
					t.Logf("request %d.%d: %v", round, i, err)
				}
			} else {
				s := client.Chat.Completions.NewStreaming(tctx(), params)
				for s.Next() {
				}
				if s.Err() != nil {
					t.Logf("stream %d.%d: %v", round, i, s.Err())
				}
			}
		}
		_, _ = bad.Chat.Completions.New(tctx(), params)
		fams = scrape()
		if !slices.ContainsFunc(needed, func(n string) bool { return fams[n] == nil }) {
			break
		}
	}
	for _, n := range needed {
		if fams[n] == nil {
			t.Fatalf("after 300 requests the gateway still exposes no %s", n)
		}
	}

	// tailgate_build_info says what `tailgate version` says.
	bi := fams["tailgate_build_info"]
	if bi == nil || len(bi.Metric) != 1 || bi.Metric[0].GetGauge().GetValue() != 1 {
		t.Fatalf("tailgate_build_info: %v", bi)
	}
	labels := map[string]string{}
	for _, l := range bi.Metric[0].Label {
		labels[l.GetName()] = l.GetValue()
	}
	ver := tailgate(t, "version")
	for _, k := range []string{"version", "revision", "goversion", "tailscale"} {
		if labels[k] == "" || !strings.Contains(ver, labels[k]) {
			t.Errorf("tailgate_build_info{%s=%q} is not what `tailgate version` says:\n%s", k, labels[k], ver)
		}
	}

	series := seriesOf(fams)
	// up is the series Prometheus itself makes per scrape target, with the
	// job the alerts' header asks for.
	series["up"] = map[string]map[string]bool{"job": {"tailgate": true}, "instance": {}}
	var queries []string
	raw, err := os.ReadFile("../deploy/grafana/tailgate-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			queries = append(queries, tg.Expr)
		}
	}
	alerts := map[string]bool{}
	for _, r := range promRules(t, alertRules) {
		queries = append(queries, r.Expr)
		alerts[r.Alert] = true
	}
	for _, a := range []string{"TailgateTTFTBudgetBurn", "TailgateReplicaOut", "TailgateReplicaLost", "TailgateModelNoReadyReplica",
		"TailgateGatewayDown", "TailgateServerErrors", "TailgateLedgerUnavailable", "TailgateBudgetNearlyUsed"} {
		if !alerts[a] {
			t.Errorf("no alert %s", a)
		}
	}
	if len(queries) < 15 {
		t.Fatalf("only %d queries found", len(queries))
	}
	for _, q := range queries {
		for _, problem := range checkQuery(q, series) {
			t.Errorf("%s\n  in: %s", problem, q)
		}
	}
}

// seriesOf maps each series name of a scrape (histograms as their _bucket,
// _sum and _count) to its label names and their values.
func seriesOf(fams map[string]*dto.MetricFamily) map[string]map[string]map[string]bool {
	out := map[string]map[string]map[string]bool{}
	add := func(name string, labels []*dto.LabelPair, extra ...string) {
		m := out[name]
		if m == nil {
			m = map[string]map[string]bool{}
			out[name] = m
		}
		for _, l := range labels {
			if m[l.GetName()] == nil {
				m[l.GetName()] = map[string]bool{}
			}
			m[l.GetName()][l.GetValue()] = true
		}
		for i := 0; i+1 < len(extra); i += 2 {
			if m[extra[i]] == nil {
				m[extra[i]] = map[string]bool{}
			}
			m[extra[i]][extra[i+1]] = true
		}
	}
	for name, f := range fams {
		for _, m := range f.Metric {
			if f.GetType() == dto.MetricType_HISTOGRAM {
				for _, b := range m.GetHistogram().GetBucket() {
					add(name+"_bucket", m.Label, "le", fmt.Sprint(b.GetUpperBound()))
				}
				add(name+"_bucket", m.Label, "le", "+Inf")
				add(name+"_sum", m.Label)
				add(name+"_count", m.Label)
				continue
			}
			add(name, m.Label)
		}
	}
	return out
}

// promKeywords are PromQL's words that are not metric names.
var promKeywords = map[string]bool{
	"sum": true, "avg": true, "min": true, "max": true, "count": true, "stddev": true, "stdvar": true, "topk": true,
	"bottomk": true, "quantile": true, "group": true, "count_values": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true,
}

var promToken = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|[A-Za-z_:][A-Za-z0-9_:]*|[0-9][0-9.eE]*[smhdwy]?|=~|!~|!=|==|>=|<=|[{}()\[\],=<>+\-*/^%]`)

// checkQuery returns what in the PromQL query q names a metric or a label
// that series does not have: metric names (identifiers used as selectors:
// not a function, keyword or label), label names in {} (of their metric),
// in by/without/on/ignoring (…) (of some metric of the query), and the
// value of an le matcher (a real bucket bound).
func checkQuery(q string, series map[string]map[string]map[string]bool) []string {
	toks := promToken.FindAllString(q, -1)
	var problems, metrics []string
	type labelUse struct{ metric, label, value string }
	var inBraces []labelUse
	var grouped []string
	for i := 0; i < len(toks); i++ {
		tok := toks[i]
		next := ""
		if i+1 < len(toks) {
			next = toks[i+1]
		}
		switch {
		case tok == "[": // a range or subquery duration
			for i < len(toks) && toks[i] != "]" {
				i++
			}
		case slices.Contains([]string{"by", "without", "on", "ignoring", "group_left", "group_right"}, tok) && next == "(":
			for i += 2; i < len(toks) && toks[i] != ")"; i++ {
				if toks[i] != "," {
					grouped = append(grouped, toks[i])
				}
			}
		case tok == "{":
			metric := ""
			if i > 0 && isIdent(toks[i-1]) {
				metric = toks[i-1]
			}
			for i++; i < len(toks) && toks[i] != "}"; i++ {
				if isIdent(toks[i]) && i+2 < len(toks) {
					inBraces = append(inBraces, labelUse{metric, toks[i], toks[i+2]})
					i += 2
				}
			}
		case isIdent(tok) && !promKeywords[strings.ToLower(tok)] && next != "(":
			metrics = append(metrics, tok)
		}
	}
	if len(metrics) == 0 {
		problems = append(problems, "names no metric")
	}
	for _, m := range metrics {
		if series[m] == nil {
			problems = append(problems, fmt.Sprintf("metric %s is not in the gateway's /metrics", m))
		}
	}
	for _, u := range inBraces {
		labels := series[u.metric]
		if labels == nil {
			continue // reported above
		}
		if labels[u.label] == nil {
			problems = append(problems, fmt.Sprintf("%s has no label %s", u.metric, u.label))
			continue
		}
		if v := strings.Trim(u.value, `"'`); u.label == "le" && !labels["le"][v] {
			problems = append(problems, fmt.Sprintf("%s has no bucket le=%q", u.metric, v))
		}
	}
	for _, l := range grouped {
		if !slices.ContainsFunc(metrics, func(m string) bool { return series[m][l] != nil }) {
			problems = append(problems, fmt.Sprintf("label %s (in by/on) is on none of %v", l, metrics))
		}
	}
	return problems
}

func isIdent(s string) bool {
	return s != "" && (s[0] == '_' || s[0] == ':' || s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z')
}

// TestCheckQueryFindsWhatIsMissing: the query checker itself catches a
// misspelt metric, a label a metric lacks, a grouping label on no metric
// and a bucket bound the histogram does not have.
func TestCheckQueryFindsWhatIsMissing(t *testing.T) {
	series := map[string]map[string]map[string]bool{
		"tailgate_ttft_seconds_bucket": {"model": {"m": true}, "answer": {"stream": true, "json": true}, "le": {"0.5": true, "+Inf": true}},
		"tailgate_ttft_seconds_count":  {"model": {"m": true}},
		"tailgate_requests_total":      {"model": {"m": true}, "code": {"200": true}},
	}
	for _, tc := range []struct {
		q    string
		want string // "" = no problem
	}{
		{`histogram_quantile(0.99, sum by (le) (rate(tailgate_ttft_seconds_bucket[$__rate_interval])))`, ""},
		{`sum by (code) (rate(tailgate_requests_total{code=~"5.."}[5m])) / sum(rate(tailgate_requests_total[5m]))`, ""},
		{`sum(rate(tailgate_request_total[5m]))`, "metric tailgate_request_total"},
		{`sum by (le) (rate(tailgate_ttft_seconds_bucket{answer="stream"}[5m]))`, ""},
		{`sum by (le) (rate(tailgate_ttft_seconds_bucket{anwser="stream"}[5m]))`, "has no label anwser"},
		{`sum(rate(tailgate_requests_total{tenant="a"}[5m]))`, "has no label tenant"},
		{`sum by (stage) (rate(tailgate_requests_total[5m]))`, "label stage"},
		{`rate(tailgate_ttft_seconds_bucket{le="0.6"}[1h]) / rate(tailgate_ttft_seconds_count[1h]) > 14.4 * 0.01`, `le="0.6"`},
	} {
		got := strings.Join(checkQuery(tc.q, series), "; ")
		if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("checkQuery(%s) = %q, want %q", tc.q, got, tc.want)
		}
	}
}
