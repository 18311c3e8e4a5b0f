package e2e

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"
)

// TestAutoscalingManifestsScaleOnExportedMetrics: the KEDA ScaledObject and
// the HPA in deploy/kubernetes parse, scale the worker Deployment of
// tailgate.yaml (KEDA from zero), and their query names only series a
// running gateway exports (tailgate_model_waiting_requests and
// tailgate_model_inflight_requests, with a model label).
func TestAutoscalingManifestsScaleOnExportedMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	raw, err := os.ReadFile("../deploy/kubernetes/autoscaling-keda.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type doc struct {
		Kind string `yaml:"kind"`
		Spec struct {
			ScaleTargetRef struct {
				Kind string `yaml:"kind"`
				Name string `yaml:"name"`
			} `yaml:"scaleTargetRef"`
			MinReplicaCount *int `yaml:"minReplicaCount"`
			MaxReplicaCount int  `yaml:"maxReplicaCount"`
			MinReplicas     int  `yaml:"minReplicas"`
			MaxReplicas     int  `yaml:"maxReplicas"`
			Triggers        []struct {
				Type     string            `yaml:"type"`
				Metadata map[string]string `yaml:"metadata"`
			} `yaml:"triggers"`
		} `yaml:"spec"`
	}
	docs := map[string]doc{}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var d doc
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		docs[d.Kind] = d
	}
	keda, hpa := docs["ScaledObject"], docs["HorizontalPodAutoscaler"]
	if keda.Spec.ScaleTargetRef.Name != "tailgate-worker" || hpa.Spec.ScaleTargetRef.Name != "tailgate-worker" {
		t.Fatalf("scale targets %q / %q, want the tailgate-worker Deployment", keda.Spec.ScaleTargetRef.Name, hpa.Spec.ScaleTargetRef.Name)
	}
	deployments, err := os.ReadFile("../deploy/kubernetes/tailgate.yaml")
	if err != nil || !bytes.Contains(deployments, []byte("name: tailgate-worker\n")) {
		t.Fatalf("tailgate.yaml has no tailgate-worker Deployment (%v)", err)
	}
	if keda.Spec.MinReplicaCount == nil || *keda.Spec.MinReplicaCount != 0 || keda.Spec.MaxReplicaCount < 1 {
		t.Fatalf("KEDA replicas %v..%d, want from 0 (scale to zero)", keda.Spec.MinReplicaCount, keda.Spec.MaxReplicaCount)
	}
	if hpa.Spec.MinReplicas < 1 || hpa.Spec.MaxReplicas < hpa.Spec.MinReplicas {
		t.Fatalf("HPA replicas %d..%d", hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas)
	}
	if len(keda.Spec.Triggers) != 1 || keda.Spec.Triggers[0].Type != "prometheus" || keda.Spec.Triggers[0].Metadata["query"] == "" {
		t.Fatalf("KEDA triggers %+v, want one prometheus query", keda.Spec.Triggers)
	}

	// What a gateway exports: checkQuery needs the names and labels only.
	p := startUp(t, "--replicas", "1")
	adminToken := readToken(t, filepath.Join(p.dir, "admin.token"))
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
	series := seriesOf(fams)
	for _, q := range []string{keda.Spec.Triggers[0].Metadata["query"],
		// the prometheus-adapter rule the HPA's external metric comes from
		`sum(tailgate_model_inflight_requests{model="x"}) by (model) + sum(tailgate_model_waiting_requests{model="x"}) by (model)`} {
		for _, problem := range checkQuery(q, series) {
			t.Errorf("%s\n  in: %s", problem, q)
		}
	}
	if !bytes.Contains(raw, []byte("tailgate_model_waiting_requests{<<.LabelMatchers>>}")) {
		t.Error("the HPA's prometheus-adapter rule does not read tailgate_model_waiting_requests")
	}
}
