package e2e

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"os"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestDeployGPUPathsReadAndWriteWhatTheyNeed reads the deploy files as the
// container runtime would and checks what only a GPU box would show: in
// compose, each worker that reads the cluster token from the gateway's
// volume runs as the uid that wrote it (the file is 0600); on Kubernetes
// each pod's user can write its volumes (fsGroup, the model cache a fresh
// PVC owned by root), the pods run as their image's user, every container
// has a startup and a liveness probe, the admin port answers only the
// workers and Prometheus (NetworkPolicy), and a node drain takes one worker
// at a time (PodDisruptionBudget).
func TestDeployGPUPathsReadAndWriteWhatTheyNeed(t *testing.T) {
	uidOf := map[string]string{ // image -> the uid its Dockerfile runs as
		"tailgate:local":      dockerUser(t, "../deploy/Dockerfile"),
		"tailgate-vllm:local": dockerUser(t, "../deploy/worker.Dockerfile"),
		"tailgate:latest":     dockerUser(t, "../deploy/Dockerfile"),
		"tailgate-vllm:latest": dockerUser(t,
			"../deploy/worker.Dockerfile"),
	}

	t.Run("compose workers read the gateway's cluster token", func(t *testing.T) {
		var compose struct {
			Services map[string]struct {
				Image   string   `yaml:"image"`
				User    string   `yaml:"user"`
				Command []string `yaml:"command"`
				Volumes []string `yaml:"volumes"`
			} `yaml:"services"`
		}
		readYAML(t, "../deploy/compose.yaml", &compose)
		gw, ok := compose.Services["gateway"]
		if !ok {
			t.Fatal("no gateway service")
		}
		writer := uidIn(cmpOr(gw.User, uidOf[gw.Image]))
		readers := 0
		for name, s := range compose.Services {
			if name == "gateway" || !strings.Contains(strings.Join(s.Command, " "), "/gateway-data/cluster.token") {
				continue
			}
			readers++
			uid := uidIn(cmpOr(s.User, uidOf[s.Image]))
			if uid == "" || uid != writer {
				t.Errorf("%s runs as uid %q (image %s), the gateway as %q: it cannot read the cluster token the gateway wrote with mode 0600", name, uid, s.Image, writer)
			}
		}
		if readers < 3 {
			t.Errorf("%d services read the gateway's cluster token, want the two sim workers and the GPU worker", readers)
		}
	})

	objs := k8sDocs(t)
	t.Run("kubernetes pods write their volumes and are probed", func(t *testing.T) {
		for _, o := range objs {
			if o["kind"] != "Deployment" {
				continue
			}
			name := dig(o, "metadata", "name")
			pod := digMap(o, "spec", "template", "spec")
			sc := digMap(pod, "securityContext")
			if sc == nil || sc["fsGroup"] == nil || sc["runAsNonRoot"] != true {
				t.Errorf("%s: pod securityContext %v, want runAsNonRoot and an fsGroup (its volumes writable to its user)", name, sc)
				continue
			}
			for _, c := range pod["containers"].([]any) {
				c := c.(map[string]any)
				if want := uidIn(uidOf[c["image"].(string)]); want != "" && asString(sc["runAsUser"]) != want {
					t.Errorf("%s: runAsUser %v, the image %s's user is %s", name, sc["runAsUser"], c["image"], want)
				}
				if asString(sc["fsGroup"]) != asString(sc["runAsGroup"]) {
					t.Errorf("%s: fsGroup %v is not the user's group %v", name, sc["fsGroup"], sc["runAsGroup"])
				}
				for _, p := range []string{"startupProbe", "livenessProbe"} {
					if c[p] == nil {
						t.Errorf("%s/%s has no %s", name, c["name"], p)
					}
				}
			}
		}
	})

	t.Run("the admin port answers the workers and Prometheus only", func(t *testing.T) {
		var np map[string]any
		for _, o := range objs {
			if o["kind"] == "NetworkPolicy" {
				np = o
			}
		}
		if np == nil {
			t.Fatal("no NetworkPolicy: the admin port (registrations, the admin API) answers the whole cluster")
		}
		gwLabels := podLabels(objs, "tailgate-gateway")
		if !maps.Equal(labelsOf(digMap(np, "spec", "podSelector", "matchLabels")), gwLabels) {
			t.Errorf("the NetworkPolicy selects %v, the gateway's pods are %v", dig(np, "spec", "podSelector"), gwLabels)
		}
		workerLabels := podLabels(objs, "tailgate-worker")
		var apiOpen, adminFromWorkers, adminOpen bool
		for _, r := range digSlice(np, "spec", "ingress") {
			r := r.(map[string]any)
			from, _ := r["from"].([]any)
			for _, p := range r["ports"].([]any) {
				switch asString(p.(map[string]any)["port"]) {
				case "api", "8080":
					apiOpen = apiOpen || len(from) == 0
				case "admin", "8081":
					adminOpen = adminOpen || len(from) == 0
					for _, f := range from {
						if sel := digMap(f.(map[string]any), "podSelector", "matchLabels"); sel != nil && maps.Equal(labelsOf(sel), workerLabels) {
							adminFromWorkers = true
						}
					}
				}
			}
		}
		if !apiOpen || adminOpen || !adminFromWorkers {
			t.Errorf("ingress: API open %v (want true), admin open to all %v (want false), admin from the worker pods %v (want true)", apiOpen, adminOpen, adminFromWorkers)
		}
	})

	t.Run("a node drain takes one worker at a time", func(t *testing.T) {
		workerLabels := podLabels(objs, "tailgate-worker")
		for _, o := range objs {
			if o["kind"] == "PodDisruptionBudget" && maps.Equal(labelsOf(digMap(o, "spec", "selector", "matchLabels")), workerLabels) {
				if asString(dig(o, "spec", "maxUnavailable")) != "1" {
					t.Errorf("the workers' PodDisruptionBudget allows %v unavailable, want 1", dig(o, "spec", "maxUnavailable"))
				}
				return
			}
		}
		t.Error("no PodDisruptionBudget selects the worker pods")
	})
}

// dockerUser returns the USER the final stage of a Dockerfile runs as.
func dockerUser(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(string(raw))
	user := ""
	for _, in := range stages[len(stages)-1].instr {
		if in[0] == "USER" {
			user = in[1]
		}
	}
	return user
}

// uidIn returns the uid of a "uid[:gid]" user.
func uidIn(user string) string {
	uid, _, _ := strings.Cut(user, ":")
	return uid
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, v); err != nil {
		t.Fatal(err)
	}
}

// k8sDocs returns deploy/kubernetes/tailgate.yaml's objects as maps.
func k8sDocs(t *testing.T) []map[string]any {
	t.Helper()
	raw, err := os.ReadFile("../deploy/kubernetes/tailgate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var o map[string]any
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		out = append(out, o)
	}
	return out
}

func dig(m map[string]any, path ...string) any {
	var v any = m
	for _, p := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[p]
	}
	return v
}

func digMap(m map[string]any, path ...string) map[string]any {
	v, _ := dig(m, path...).(map[string]any)
	return v
}

func digSlice(m map[string]any, path ...string) []any {
	v, _ := dig(m, path...).([]any)
	return v
}

func asString(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	default:
		b, _ := yaml.Marshal(v)
		return strings.TrimSpace(string(b))
	}
}

func labelsOf(m map[string]any) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = asString(v)
	}
	return out
}

// podLabels returns the pod template labels of the Deployment named.
func podLabels(objs []map[string]any, deployment string) map[string]string {
	for _, o := range objs {
		if o["kind"] == "Deployment" && dig(o, "metadata", "name") == deployment {
			return labelsOf(digMap(o, "spec", "template", "metadata", "labels"))
		}
	}
	return nil
}
