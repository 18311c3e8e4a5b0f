package e2e

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// k8sProbe is a container probe of the manifest.
type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
	Exec *struct {
		Command []string `yaml:"command"`
	} `yaml:"exec"`
}

type k8sContainer struct {
	Name    string   `yaml:"name"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
	Startup   *k8sProbe `yaml:"startupProbe"`
	Readiness *k8sProbe `yaml:"readinessProbe"`
	Liveness  *k8sProbe `yaml:"livenessProbe"`
}

type k8sObject struct {
	Kind     string
	Metadata struct {
		Name   string
		Labels map[string]string
	}
	Spec struct {
		Selector                 map[string]any `yaml:"selector"`
		PublishNotReadyAddresses bool           `yaml:"publishNotReadyAddresses"`
		Ports                    []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort string `yaml:"targetPort"`
		} `yaml:"ports"`
		Template struct {
			Metadata struct {
				Labels map[string]string
			}
			Spec struct {
				Containers []k8sContainer `yaml:"containers"`
				Volumes    []struct {
					Name     string         `yaml:"name"`
					PVC      map[string]any `yaml:"persistentVolumeClaim"`
					EmptyDir map[string]any `yaml:"emptyDir"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

func readK8s(t *testing.T) []k8sObject {
	t.Helper()
	raw, err := os.ReadFile("../deploy/kubernetes/tailgate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var objs []k8sObject
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var o k8sObject
		if err := dec.Decode(&o); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o)
	}
	return objs
}

// TestKubernetesStartsFromNothing pins the rules whose breaking deadlocked a
// fresh install: the workers register through a Service of the gateway, a
// Service routes only to ready pods (unless it publishes not-ready ones),
// so the gateway's readiness must not wait for a replica — /healthz does,
// /readyz does not. Every HTTP probe's path answers (not 404) on the port it
// names, on a real gateway started with the manifest's flags; every exec
// probe is a command the binary accepts; the workers' model cache is on a
// PersistentVolumeClaim.
func TestKubernetesStartsFromNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	objs := readK8s(t)
	type podOf struct {
		deploy string
		labels map[string]string
		c      k8sContainer
	}
	var pods []podOf
	var gw *podOf
	for _, o := range objs {
		if o.Kind != "Deployment" {
			continue
		}
		for _, c := range o.Spec.Template.Spec.Containers {
			pods = append(pods, podOf{o.Metadata.Name, o.Spec.Template.Metadata.Labels, c})
			if len(c.Args) > 0 && c.Args[0] == "gateway" {
				gw = &pods[len(pods)-1]
			}
		}
	}
	if gw == nil {
		t.Fatal("no gateway Deployment")
	}
	selects := func(sel map[string]any, labels map[string]string) bool {
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}

	// Who registers where: each worker's --gateway names a Service and port
	// that lead to the gateway's admin port.
	workers := 0
	for _, p := range pods {
		if len(p.c.Args) == 0 || p.c.Args[0] != "worker" {
			continue
		}
		workers++
		u, err := url.Parse(flagValue(p.c.Args, "gateway"))
		if err != nil {
			t.Fatalf("%s: --gateway: %v", p.deploy, err)
		}
		var svc *k8sObject
		for i, o := range objs {
			if o.Kind == "Service" && o.Metadata.Name == u.Hostname() {
				svc = &objs[i]
			}
		}
		if svc == nil {
			t.Fatalf("%s registers at %s, not a Service of the manifest", p.deploy, u)
		}
		if !selects(svc.Spec.Selector, gw.labels) {
			t.Fatalf("Service %s does not select the gateway's pods", svc.Metadata.Name)
		}
		target := ""
		for _, sp := range svc.Spec.Ports {
			if u.Port() == strconv.Itoa(sp.Port) {
				target = sp.TargetPort
			}
		}
		if target != "admin" {
			t.Errorf("%s registers at %s, which Service %s sends to port %q, not the gateway's admin port", p.deploy, u, svc.Metadata.Name, target)
		}
		// The deadlock: the Service routes only to ready pods, so what
		// makes the gateway ready must not wait for a worker.
		if !svc.Spec.PublishNotReadyAddresses {
			r := gw.c.Readiness
			if r == nil || r.HTTPGet == nil {
				t.Errorf("the gateway has no HTTP readiness probe")
			} else if r.HTTPGet.Path != "/readyz" {
				t.Errorf("the gateway's readiness probe %s:%s gates Service %s, through which the workers register: it must not wait for a ready replica (/healthz does; use /readyz on the admin port)",
					r.HTTPGet.Port, r.HTTPGet.Path, svc.Metadata.Name)
			}
		}
		if p.c.Liveness == nil || p.c.Startup == nil {
			t.Errorf("%s: no liveness or startup probe", p.deploy)
		}
		// The model cache outlives the pod.
		cache := ""
		for _, e := range p.c.Env {
			if e.Name == "HF_HOME" {
				cache = e.Value
			}
		}
		onClaim := false
		for _, m := range p.c.VolumeMounts {
			for _, v := range p.c.volumesOf(objs, p.deploy) {
				if v == m.Name && (cache == m.MountPath || strings.HasPrefix(cache, m.MountPath+"/")) && m.MountPath != "/data" {
					onClaim = true
				}
			}
		}
		if cache == "" || !onClaim {
			t.Errorf("%s: the model cache (HF_HOME %q) is not on a PersistentVolumeClaim: every new pod downloads the model again", p.deploy, cache)
		}
	}
	if workers == 0 {
		t.Fatal("no worker Deployment")
	}
	if gw.c.Liveness == nil || gw.c.Startup == nil {
		t.Error("the gateway has no liveness or startup probe")
	}

	// Every probe against the real thing: a gateway started with the
	// manifest's flags (on loopback, port 0), asked each HTTP probe's path
	// on the port the probe names; exec probes parse.
	g := startGateway(t, "--log-format", "json")
	base := map[string]string{}
	for _, p := range gw.c.Ports {
		switch strconv.Itoa(p.ContainerPort) {
		case portOf(t, flagValue(gw.c.Args, "listen")):
			base[p.Name] = strings.TrimSuffix(g.api, "/v1")
		case portOf(t, flagValue(gw.c.Args, "admin-listen")):
			base[p.Name] = g.admin
		}
	}
	for _, p := range pods {
		for kind, pr := range map[string]*k8sProbe{"startup": p.c.Startup, "readiness": p.c.Readiness, "liveness": p.c.Liveness} {
			switch {
			case pr == nil:
			case pr.HTTPGet != nil:
				if p.c.Args[0] != "gateway" {
					t.Errorf("%s: %s probe: HTTP probes of a worker cannot send the sidecar's token", p.deploy, kind)
					continue
				}
				b := base[pr.HTTPGet.Port]
				if b == "" {
					t.Errorf("%s: %s probe names port %q, which the container does not expose", p.deploy, kind, pr.HTTPGet.Port)
					continue
				}
				resp, err := http.Get(b + pr.HTTPGet.Path)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusUnauthorized {
					t.Errorf("%s: %s probe %s on port %s: %d", p.deploy, kind, pr.HTTPGet.Path, pr.HTTPGet.Port, resp.StatusCode)
				}
				if kind == "readiness" && resp.StatusCode != http.StatusOK {
					t.Errorf("%s: readiness probe %s is %d on a gateway with no worker yet: the workers could never register", p.deploy, pr.HTTPGet.Path, resp.StatusCode)
				}
			case pr.Exec != nil:
				cmd := pr.Exec.Command
				if len(cmd) < 2 || filepath.Base(cmd[0]) != "tailgate" {
					t.Errorf("%s: %s probe %v does not run tailgate", p.deploy, kind, cmd)
					continue
				}
				checkHealthcheckArgs(t, p.deploy+" "+kind+" probe", cmd[1:])
			}
		}
	}
}

// volumesOf returns the names of the PersistentVolumeClaim volumes of the
// Deployment deploy.
func (c k8sContainer) volumesOf(objs []k8sObject, deploy string) []string {
	var out []string
	for _, o := range objs {
		if o.Kind == "Deployment" && o.Metadata.Name == deploy {
			for _, v := range o.Spec.Template.Spec.Volumes {
				if v.PVC != nil {
					out = append(out, v.Name)
				}
			}
		}
	}
	return out
}

func portOf(t *testing.T, addr string) string {
	t.Helper()
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		t.Fatalf("address %q has no port", addr)
	}
	return addr[i+1:]
}

// TestContainerImagesCheckTheirHealth: both images name a HEALTHCHECK that
// runs `tailgate healthcheck` with flags the binary accepts (distroless has
// no curl), so does every compose service, and the workers wait for a
// healthy gateway; the build context's .dockerignore keeps the data
// directory, databases, tokens and .git out of it.
func TestContainerImagesCheckTheirHealth(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the built binary")
	}
	for _, file := range []string{"../deploy/Dockerfile", "../deploy/worker.Dockerfile"} {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		stages := parseDockerfile(string(raw))
		final := stages[len(stages)-1]
		var hc string
		for _, in := range final.instr {
			if in[0] == "HEALTHCHECK" {
				hc = in[1]
			}
		}
		_, form, ok := strings.Cut(hc, "CMD ")
		var cmd []string
		if !ok || yaml.Unmarshal([]byte(form), &cmd) != nil || len(cmd) < 2 || filepath.Base(cmd[0]) != "tailgate" || cmd[1] != "healthcheck" {
			t.Errorf("%s: HEALTHCHECK %q: want CMD in the exec form running tailgate healthcheck", file, hc)
			continue
		}
		checkHealthcheckArgs(t, file+" HEALTHCHECK", cmd[1:])
		if !strings.Contains(hc, "--start-period=") {
			t.Errorf("%s: HEALTHCHECK without a --start-period", file)
		}
	}

	raw, err := os.ReadFile("../deploy/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Services map[string]struct {
			Command     []string       `yaml:"command"`
			DependsOn   map[string]any `yaml:"depends_on"`
			Healthcheck struct {
				Test []string `yaml:"test"`
			} `yaml:"healthcheck"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	for name, s := range c.Services {
		test := s.Healthcheck.Test
		if len(test) < 3 || test[0] != "CMD" || filepath.Base(test[1]) != "tailgate" || test[2] != "healthcheck" {
			t.Errorf("service %s: healthcheck %v: want [CMD tailgate healthcheck ...]", name, test)
			continue
		}
		checkHealthcheckArgs(t, "service "+name+" healthcheck", test[2:])
		if name == "gateway" {
			continue
		}
		if dep, _ := s.DependsOn["gateway"].(map[string]any); dep["condition"] != "service_healthy" {
			t.Errorf("service %s starts before the gateway is healthy: depends_on %v", name, s.DependsOn)
		}
		if !slices.Contains(test, "--url") {
			t.Errorf("service %s: a worker checks its sidecar (--url http://127.0.0.1:PORT/health), not the gateway's default", name)
		}
	}

	ignore, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(".dockerignore: ", err)
	}
	lines := strings.Fields(string(ignore))
	for _, want := range []string{".git", "tailgate-data/", "**/*.db", "**/*.token", "**/*.key"} {
		if !slices.Contains(lines, want) {
			t.Errorf(".dockerignore does not exclude %s", want)
		}
	}
}

// TestHealthcheckCommandExitCodes: `tailgate healthcheck` exits 0 for a
// healthy answer, 1 for an unhealthy one, a refused connection or a missing
// token; --alive takes a 503 as alive; --admin asks /readyz; the token comes
// from the environment or a file.
func TestHealthcheckCommandExitCodes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the built binary")
	}
	g := startGateway(t)
	public := strings.TrimSuffix(g.api, "/v1")
	adminHost := strings.TrimPrefix(g.admin, "http://")
	dead := "http://" + freeAddr(t)
	tokenFile := filepath.Join(t.TempDir(), "cluster.token")
	if err := os.WriteFile(tokenFile, []byte("tgc-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A stand-in sidecar: 401 without the cluster token, 503 while its engine loads.
	sidecar := startHealthStandIn(t, "tgc-secret")
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want int
	}{
		{"no replica yet: /healthz 503", []string{"--url", public + "/healthz"}, nil, 1},
		{"--admin: /readyz 200", []string{"--admin", adminHost}, nil, 0},
		{"nothing listens", []string{"--url", dead + "/healthz"}, nil, 1},
		{"no health endpoint there", []string{"--url", g.admin + "/nope"}, nil, 1},
		{"sidecar without its token", []string{"--url", sidecar + "/health", "--alive"}, nil, 1},
		{"sidecar loading, ready asked", []string{"--url", sidecar + "/health", "--cluster-token-file", tokenFile}, nil, 1},
		{"sidecar loading, alive asked", []string{"--url", sidecar + "/health", "--cluster-token-file", tokenFile, "--alive"}, nil, 0},
		{"token from the environment", []string{"--url", sidecar + "/health", "--alive"}, []string{"TAILGATE_CLUSTER_TOKEN=tgc-secret"}, 0},
	} {
		cmd := exec.Command(binPath, append([]string{"healthcheck"}, tc.args...)...)
		cmd.Env = append(os.Environ(), tc.env...)
		out, _ := cmd.CombinedOutput()
		if got := cmd.ProcessState.ExitCode(); got != tc.want {
			t.Errorf("%s: exit %d, want %d\n%s", tc.name, got, tc.want, out)
		}
		if strings.Contains(string(out), "tgc-secret") {
			t.Errorf("%s: the token is in the output:\n%s", tc.name, out)
		}
	}
}

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// startHealthStandIn serves a sidecar's /health as a worker whose engine
// still loads answers it: 401 without the cluster token, else 503 starting.
func startHealthStandIn(t *testing.T, token string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get("Authorization") != "Bearer "+token:
			w.WriteHeader(http.StatusUnauthorized)
		case r.URL.Path != "/health":
			w.WriteHeader(http.StatusNotFound)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"state":"starting","reason":"loading weights"}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// checkHealthcheckArgs fails t unless args are `healthcheck ...` with flags
// the binary accepts (as checkArgs does for the long-running commands).
func checkHealthcheckArgs(t *testing.T, where string, args []string) {
	t.Helper()
	if len(args) == 0 || args[0] != "healthcheck" {
		t.Errorf("%s: %v does not run tailgate healthcheck", where, args)
		return
	}
	out, err := exec.Command(binPath, append(slices.Clone(args), "-h")...).CombinedOutput()
	if err != nil {
		t.Errorf("%s: tailgate %s refuses its flags: %v\n%s", where, strings.Join(args, " "), err, testkit.LastLine(string(out)))
	}
}
