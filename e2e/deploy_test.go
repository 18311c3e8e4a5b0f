package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// The files in deploy/ are product: each test here parses one and checks it
// against the real binary (its flags, its defaults, its metrics).

// checkArgs fails t unless the binary's own parser accepts args (a command
// and its flags): `tailgate CMD ARGS... -h` exits 0 only if every flag
// before -h exists and its value parses.
func checkArgs(t *testing.T, where string, args []string) {
	t.Helper()
	if len(args) == 0 {
		t.Errorf("%s: no command", where)
		return
	}
	if !slices.Contains([]string{"gateway", "worker", "sim", "up"}, args[0]) {
		t.Errorf("%s: %q is not a long-running tailgate command", where, args[0])
		return
	}
	out, err := exec.Command(binPath, append(slices.Clone(args), "-h")...).CombinedOutput()
	if err != nil {
		t.Errorf("%s: tailgate %s refuses its flags: %v\n%s", where, strings.Join(args, " "), err, testkit.LastLine(string(out)))
	}
}

// flagValue returns the value of --name in args, or "".
func flagValue(args []string, name string) string {
	for i, a := range args {
		if (a == "--"+name || a == "-"+name) && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// defaultOf is the default of a duration flag of the gateway or the worker,
// as the binary's `CMD --help-all` prints it (every flag; -h shows only
// the ones a newcomer needs first; a zero default is left out).
func defaultOf(t *testing.T, cmd, name string) time.Duration {
	t.Helper()
	out, err := exec.Command(binPath, cmd, "--help-all").CombinedOutput()
	if err != nil {
		t.Fatalf("tailgate %s --help-all: %v\n%s", cmd, err, out)
	}
	for block := range strings.SplitSeq(string(out), "\n  -") {
		if rest, ok := strings.CutPrefix(block, name); !ok || (rest != "" && rest[0] != ' ' && rest[0] != '\n') {
			continue
		}
		m := regexp.MustCompile(`\(default ([^)]+)\)\s*$`).FindStringSubmatch(block)
		if m == nil {
			return 0
		}
		d, err := time.ParseDuration(m[1])
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	t.Fatalf("tailgate %s --help-all lists no --%s", cmd, name)
	return 0
}

// unitFile is a systemd unit: section → key → values, in order.
type unitFile map[string]map[string][]string

func parseUnit(t *testing.T, raw string) unitFile {
	t.Helper()
	u := unitFile{}
	section := ""
	raw = strings.ReplaceAll(raw, "\\\n", " ")
	for line := range strings.Lines(raw) {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("unit line %q", line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

func (u unitFile) get(section, key string) string {
	v := u[section][key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// TestSystemdUnitsVerifyAndAreHardened: systemd-analyze verify accepts each
// unit without a warning (with ExecStart pointing at a built binary, as it
// must exist), each runs as its own user with a state directory, hardened,
// stops with SIGTERM and waits longer than the role's drain grace, and its
// ExecStart is a command line the binary accepts.
func TestSystemdUnitsVerifyAndAreHardened(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the built binary")
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatal("systemd-analyze not found: install Debian's systemd package (scripts/test.sh does)")
	}
	for _, tc := range []struct{ file, cmd, grace string }{
		{"tailgate-gateway.service", "gateway", "shutdown-grace"},
		{"tailgate-worker.service", "worker", "drain-grace"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("../deploy", "systemd", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			const installed = "/usr/local/bin/tailgate"
			if !strings.Contains(string(raw), "ExecStart="+installed+" ") {
				t.Fatalf("ExecStart does not run %s", installed)
			}
			dir := t.TempDir()
			unit := filepath.Join(dir, tc.file)
			if err := os.WriteFile(unit, []byte(strings.ReplaceAll(string(raw), "ExecStart="+installed, "ExecStart="+binPath)), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(analyze, "verify", "--man=no", unit)
			cmd.Env = append(os.Environ(), "SYSTEMD_LOG_COLOR=0")
			out, err := cmd.CombinedOutput()
			if err != nil || len(bytes.TrimSpace(out)) > 0 {
				t.Errorf("systemd-analyze verify: %v\n%s", err, out)
			}

			u := parseUnit(t, string(raw))
			s := "Service"
			if u.get(s, "User") == "" && u.get(s, "DynamicUser") != "yes" {
				t.Error("runs as root: want User= or DynamicUser=yes")
			}
			if u.get(s, "User") == "root" {
				t.Error("User=root")
			}
			for k, want := range map[string]string{
				"NoNewPrivileges": "yes", "ProtectSystem": "strict", "KillSignal": "SIGTERM", "ProtectHome": "yes", "PrivateTmp": "yes",
			} {
				if got := u.get(s, k); got != want {
					t.Errorf("%s=%q, want %q", k, got, want)
				}
			}
			state := u.get(s, "StateDirectory")
			if state == "" {
				t.Fatal("no StateDirectory=")
			}
			stop, err := time.ParseDuration(u.get(s, "TimeoutStopSec") + "s")
			if err != nil {
				t.Fatalf("TimeoutStopSec=%q: want seconds", u.get(s, "TimeoutStopSec"))
			}
			if grace := defaultOf(t, tc.cmd, tc.grace); stop <= grace {
				t.Errorf("TimeoutStopSec=%v is not above the --%s default %v: systemd would kill the %s while it drains", stop, tc.grace, grace, tc.cmd)
			}
			args := strings.Fields(u.get(s, "ExecStart"))[1:]
			if args[0] != tc.cmd {
				t.Fatalf("ExecStart runs %q, want %q", args[0], tc.cmd)
			}
			checkArgs(t, tc.file, args)
			if d := flagValue(args, "data"); d != "/var/lib/"+state {
				t.Errorf("--data %q is not the StateDirectory /var/lib/%s (the only writable place under ProtectSystem=strict)", d, state)
			}
			if tc.cmd == "worker" {
				if flagValue(args, "gateway") == "" || flagValue(args, "engine") != "vllm" || flagValue(args, "model") == "" {
					t.Errorf("the worker unit needs --gateway, --engine vllm and --model: %v", args)
				}
				if flagValue(args, "cluster-token-file") == "" {
					t.Errorf("the worker unit reads no cluster token file: %v", args)
				}
				if u.get(s, "PrivateDevices") == "yes" {
					t.Error("PrivateDevices=yes hides the GPUs from vLLM")
				}
			}
		})
	}
}

// dockerfile is a Dockerfile's instructions, stage by stage.
type dockerStage struct {
	from, name string
	instr      [][2]string // instruction, rest of the line
}

func parseDockerfile(raw string) []dockerStage {
	var stages []dockerStage
	raw = strings.ReplaceAll(raw, "\\\n", " ")
	for line := range strings.Lines(raw) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		ins, rest, _ := strings.Cut(line, " ")
		ins = strings.ToUpper(ins)
		if ins == "FROM" {
			f := strings.Fields(rest)
			st := dockerStage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			stages = append(stages, st)
			continue
		}
		if len(stages) > 0 {
			st := &stages[len(stages)-1]
			st.instr = append(st.instr, [2]string{ins, strings.TrimSpace(rest)})
		}
	}
	return stages
}

// TestDockerfileBuildsAStaticNonRootImage: a build stage and a small final
// stage that runs as a non-root user with the binary as its entry point;
// the build stage's `go build` builds here with CGO off, and what it builds
// runs.
func TestDockerfileBuildsAStaticNonRootImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	raw, err := os.ReadFile("../deploy/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(string(raw))
	if len(stages) != 2 || stages[0].name == "" {
		t.Fatalf("want a named build stage and a final stage, got %d stages", len(stages))
	}
	build, final := stages[0], stages[1]
	if !strings.HasPrefix(final.from, "gcr.io/distroless/static") && !strings.HasPrefix(final.from, "alpine") && final.from != "scratch" {
		t.Errorf("final stage FROM %s: want a small base (distroless static, alpine, scratch)", final.from)
	}
	var user, entry, buildCmd, binOut string
	args := map[string]string{}
	for _, in := range build.instr {
		switch in[0] {
		case "ARG":
			k, v, _ := strings.Cut(in[1], "=")
			args[k] = v
		case "RUN":
			if strings.Contains(in[1], "go build") {
				buildCmd, _, _ = strings.Cut(in[1], " && ")
			}
		}
	}
	copied := map[string]bool{}
	for _, in := range final.instr {
		switch in[0] {
		case "USER":
			user = in[1]
		case "ENTRYPOINT":
			entry = in[1]
		case "COPY":
			f := strings.Fields(in[1])
			if slices.Contains(f, "--from="+build.name) {
				copied[f[len(f)-1]] = true
				if strings.HasSuffix(f[len(f)-2], "/tailgate") {
					binOut = f[len(f)-2]
				}
			}
		}
	}
	if u, _, _ := strings.Cut(user, ":"); user == "" || u == "root" || u == "0" {
		t.Errorf("final stage USER %q: want a non-root user", user)
	}
	var ep []string
	if err := yaml.Unmarshal([]byte(entry), &ep); err != nil || len(ep) != 1 || !copied[ep[0]] {
		t.Errorf("ENTRYPOINT %s: want the exec form naming the binary copied from the build stage (%v)", entry, copied)
	}
	if !strings.Contains(buildCmd, "CGO_ENABLED=0") || binOut == "" || !strings.Contains(buildCmd, "-o "+binOut) {
		t.Fatalf("build command %q: want CGO_ENABLED=0 go build -o %s", buildCmd, binOut)
	}
	// The same command here, its output in a temporary directory.
	out := t.TempDir()
	sh := strings.ReplaceAll(buildCmd, "-o "+binOut, "-o "+filepath.Join(out, "tailgate"))
	sh = os.Expand(sh, func(k string) string { return args[k] })
	cmd := exec.Command("sh", "-c", sh)
	cmd.Dir = ".." // the build context: the repository's root
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", sh, err, msg)
	}
	got, err := exec.Command(filepath.Join(out, "tailgate"), "version").Output()
	if err != nil || !strings.HasPrefix(string(got), "tailgate "+args["VERSION"]+"\n") {
		t.Fatalf("the image's binary says %q (%v); want version %s", got, err, args["VERSION"])
	}
	// The default command is one the binary accepts.
	for _, in := range final.instr {
		if in[0] == "CMD" {
			var c []string
			if err := yaml.Unmarshal([]byte(in[1]), &c); err != nil {
				t.Fatal(err)
			}
			checkArgs(t, "Dockerfile CMD", c)
		}
	}
}

// workerImage is what deploy/worker.Dockerfile makes: the name its header
// builds it as, its vLLM tag, its entry point and default command.
type workerImage struct {
	name, vllmTag string
	build, final  dockerStage
	entry, cmd    []string
}

var (
	workerImageBuild = regexp.MustCompile(`(?m)^#\s+docker build -f deploy/worker\.Dockerfile -t (\S+) `)
	vllmImageTag     = regexp.MustCompile(`^vllm/vllm-openai:v(\d+\.\d+\.\d+)$`)
	readmeVLLM       = regexp.MustCompile(`checked against vLLM's source and published captures up to (\d+\.\d+\.\d+)`)
)

func readWorkerImage(t *testing.T) workerImage {
	t.Helper()
	raw, err := os.ReadFile("../deploy/worker.Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var w workerImage
	if m := workerImageBuild.FindStringSubmatch(string(raw)); m != nil {
		w.name = m[1]
	} else {
		t.Error("deploy/worker.Dockerfile's header does not say how to build it (docker build -f deploy/worker.Dockerfile -t NAME ...)")
	}
	stages := parseDockerfile(string(raw))
	if len(stages) != 2 {
		t.Fatalf("deploy/worker.Dockerfile: %d stages, want a build stage and the vLLM stage", len(stages))
	}
	w.build, w.final = stages[0], stages[1]
	if m := vllmImageTag.FindStringSubmatch(w.final.from); m != nil {
		w.vllmTag = m[1]
	}
	for _, in := range w.final.instr {
		var dst *[]string
		switch in[0] {
		case "ENTRYPOINT":
			dst = &w.entry
		case "CMD":
			dst = &w.cmd
		default:
			continue
		}
		if err := yaml.Unmarshal([]byte(in[1]), dst); err != nil {
			t.Errorf("%s %s: want the exec form (a JSON list): %v", in[0], in[1], err)
		}
	}
	return w
}

// TestWorkerImageRunsTheWorkerOnVLLM: deploy/worker.Dockerfile builds the
// binary as deploy/Dockerfile does (that test builds and runs it), adds it
// to the official vLLM image at the release the README says the launcher
// was checked against, runs as a user of its own, and its entry point plus
// default command is a `tailgate worker --engine vllm` the binary accepts,
// which finds vllm on the image's PATH (no --vllm-binary).
func TestWorkerImageRunsTheWorkerOnVLLM(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the built binary")
	}
	w := readWorkerImage(t)
	raw, err := os.ReadFile("../deploy/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if gw := parseDockerfile(string(raw)); !slices.Equal(gw[0].instr, w.build.instr) || gw[0].from != w.build.from {
		t.Errorf("the worker image's build stage differs from deploy/Dockerfile's:\n%v\n%v", w.build, gw[0])
	}
	readme, err := os.ReadFile("../docs/commands.md")
	if err != nil {
		t.Fatal(err)
	}
	checked := readmeVLLM.FindStringSubmatch(string(readme))
	switch {
	case w.vllmTag == "":
		t.Errorf("final stage FROM %s: want the official image at a pinned release, vllm/vllm-openai:vX.Y.Z", w.final.from)
	case checked == nil:
		t.Error("the README no longer says which vLLM release the launcher was checked against")
	case checked[1] != w.vllmTag:
		t.Errorf("the image runs vLLM %s, the README says the launcher was checked up to %s", w.vllmTag, checked[1])
	}
	var user, bin string
	for _, in := range w.final.instr {
		switch in[0] {
		case "USER":
			user = in[1]
		case "COPY":
			if f := strings.Fields(in[1]); slices.Contains(f, "--from="+w.build.name) && strings.HasSuffix(f[len(f)-2], "/tailgate") {
				bin = f[len(f)-1]
			}
		}
	}
	if u, _, _ := strings.Cut(user, ":"); user == "" || u == "root" || u == "0" {
		t.Errorf("USER %q: want a user of its own, not root", user)
	}
	if len(w.entry) < 2 || w.entry[0] != bin || w.entry[1] != "worker" {
		t.Fatalf("ENTRYPOINT %v: want [%s worker ...], the binary copied from the build stage", w.entry, bin)
	}
	args := slices.Concat(w.entry[1:], w.cmd)
	if flagValue(args, "engine") != "vllm" || flagValue(args, "vllm-binary") != "" {
		t.Errorf("worker %v: want --engine vllm with vllm found on the image's PATH", args)
	}
	if flagValue(args, "data") == "" || !slices.ContainsFunc(w.final.instr, func(in [2]string) bool {
		return in[0] == "VOLUME" && strings.Contains(in[1], flagValue(args, "data"))
	}) {
		t.Errorf("worker --data %q is not the image's VOLUME", flagValue(args, "data"))
	}
	checkArgs(t, "worker.Dockerfile ENTRYPOINT+CMD", args)
}

// composeArgs is the command a compose service runs: the worker image's
// entry point (after the binary) before its command when it runs that
// image, else its command.
func composeArgs(w workerImage, image string, build map[string]any, command []string) []string {
	if build["dockerfile"] == "deploy/worker.Dockerfile" || strings.HasPrefix(image, w.name+":") {
		return slices.Concat(w.entry[1:], command)
	}
	return command
}

// TestComposeFileIsConsistent: every service runs a command the binary
// accepts; the gateway's published ports are those it listens on; each
// worker reaches the gateway by its service name and admin port,
// advertises its own name and port, and reads its token from a mounted
// volume; every volume is declared.
func TestComposeFileIsConsistent(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the built binary")
	}
	raw, err := os.ReadFile("../deploy/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Services map[string]struct {
			Image    string         `yaml:"image"`
			Build    map[string]any `yaml:"build"`
			Command  []string       `yaml:"command"`
			Profiles []string       `yaml:"profiles"`
			Ports    []string       `yaml:"ports"`
			Volumes  []string       `yaml:"volumes"`
		} `yaml:"services"`
		Volumes map[string]any `yaml:"volumes"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&c); err != nil {
		t.Fatal(err)
	}
	if b := c.Services["gateway"].Build; b == nil || b["dockerfile"] != "deploy/Dockerfile" {
		t.Errorf("the gateway service does not build deploy/Dockerfile: %v", b)
	}
	if _, err := os.Stat(filepath.Join("../deploy", fmt.Sprint(c.Services["gateway"].Build["context"]), "go.mod")); err != nil {
		t.Errorf("build context is not the repository root: %v", err)
	}
	portOf := func(addr string) string {
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Errorf("address %q: %v", addr, err)
		}
		return p
	}
	gw := c.Services["gateway"].Command
	adminPort := portOf(flagValue(gw, "admin-listen"))
	wi := readWorkerImage(t)
	workers, gpuWorkers := 0, 0
	for name, s := range c.Services {
		s.Command = composeArgs(wi, s.Image, s.Build, s.Command)
		checkArgs(t, "service "+name, s.Command)
		mounts := map[string]bool{}
		for _, v := range s.Volumes {
			parts := strings.Split(v, ":")
			if _, ok := c.Volumes[parts[0]]; !ok {
				t.Errorf("service %s mounts volume %q, not declared under volumes:", name, parts[0])
			}
			mounts[parts[1]] = true
		}
		underMount := func(p string) bool {
			for m := range mounts {
				if p == m || strings.HasPrefix(p, m+"/") {
					return true
				}
			}
			return false
		}
		if d := flagValue(s.Command, "data"); !underMount(d) {
			t.Errorf("service %s: --data %s is not on a volume (lost on every re-create)", name, d)
		}
		for _, p := range s.Ports {
			parts := strings.Split(p, ":")
			container := parts[len(parts)-1]
			if container != portOf(flagValue(s.Command, "listen")) && container != portOf(cmpOr(flagValue(s.Command, "admin-listen"), "x:none")) {
				t.Errorf("service %s publishes container port %s, which it does not listen on", name, container)
			}
		}
		if s.Command[0] != "worker" {
			continue
		}
		if flagValue(s.Command, "engine") == "vllm" {
			// A GPU worker runs the worker image, and only when asked for:
			// `docker compose up` alone must work on a box without a GPU.
			gpuWorkers++
			if s.Build["dockerfile"] != "deploy/worker.Dockerfile" || !strings.HasPrefix(s.Image, wi.name+":") {
				t.Errorf("service %s runs vLLM but not the worker image (build %v, image %s; want deploy/worker.Dockerfile as %s)", name, s.Build, s.Image, wi.name)
			}
			if len(s.Profiles) == 0 {
				t.Errorf("service %s needs a GPU but starts with every `docker compose up`: give it a profile", name)
			}
		} else {
			workers++
		}
		g, err := url.Parse(flagValue(s.Command, "gateway"))
		if err != nil || g.Hostname() != "gateway" || g.Port() != adminPort {
			t.Errorf("service %s: --gateway %s is not the gateway service's admin port %s", name, flagValue(s.Command, "gateway"), adminPort)
		}
		a, err := url.Parse(flagValue(s.Command, "advertise"))
		if err != nil || a.Hostname() != name || a.Port() != portOf(flagValue(s.Command, "listen")) {
			t.Errorf("service %s: --advertise %s is not its own name and --listen port", name, flagValue(s.Command, "advertise"))
		}
		if f := flagValue(s.Command, "cluster-token-file"); !underMount(f) {
			t.Errorf("service %s: --cluster-token-file %s is on no volume", name, f)
		}
	}
	if workers < 2 {
		t.Errorf("%d simulated workers; want at least 2", workers)
	}
	if gpuWorkers == 0 {
		t.Error("no GPU worker service (deploy/worker.Dockerfile) in the compose file")
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestKubernetesManifestsAreConsistent: every object is of a known kind;
// the gateway runs one replica on a claimed volume; containers run flags
// the binary accepts; every secret reference names a key of the Secret;
// every volume mount names a volume of its pod; the worker asks for a GPU.
func TestKubernetesManifestsAreConsistent(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the built binary")
	}
	raw, err := os.ReadFile("../deploy/kubernetes/tailgate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type container struct {
		Name    string   `yaml:"name"`
		Image   string   `yaml:"image"`
		Command []string `yaml:"command"`
		Args    []string `yaml:"args"`
		Env     []struct {
			Name      string `yaml:"name"`
			ValueFrom struct {
				SecretKeyRef *struct{ Name, Key string } `yaml:"secretKeyRef"`
			} `yaml:"valueFrom"`
		} `yaml:"env"`
		VolumeMounts []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
		} `yaml:"volumeMounts"`
		Resources struct {
			Limits map[string]string `yaml:"limits"`
		} `yaml:"resources"`
	}
	type object struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Metadata   struct{ Name string }
		StringData map[string]string `yaml:"stringData"`
		Spec       struct {
			Replicas *int `yaml:"replicas"`
			Template struct {
				Spec struct {
					InitContainers []container `yaml:"initContainers"`
					Containers     []container `yaml:"containers"`
					Volumes        []struct {
						Name   string `yaml:"name"`
						Secret *struct {
							SecretName string `yaml:"secretName"`
						} `yaml:"secret"`
						PVC *struct {
							ClaimName string `yaml:"claimName"`
						} `yaml:"persistentVolumeClaim"`
					} `yaml:"volumes"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	known := map[string]string{"Secret": "v1", "Service": "v1", "PersistentVolumeClaim": "v1", "Deployment": "apps/v1", "StatefulSet": "apps/v1",
		"NetworkPolicy": "networking.k8s.io/v1", "PodDisruptionBudget": "policy/v1"}
	var objs []object
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var o object
		if err := dec.Decode(&o); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if known[o.Kind] != o.APIVersion {
			t.Errorf("%s %s: apiVersion %q, want %q", o.Kind, o.Metadata.Name, o.APIVersion, known[o.Kind])
		}
		objs = append(objs, o)
	}
	secrets, claims := map[string]map[string]string{}, map[string]bool{}
	for _, o := range objs {
		switch o.Kind {
		case "Secret":
			secrets[o.Metadata.Name] = o.StringData
		case "PersistentVolumeClaim":
			claims[o.Metadata.Name] = true
		}
	}
	roles := map[string]bool{}
	for _, o := range objs {
		if o.Kind != "Deployment" && o.Kind != "StatefulSet" {
			continue
		}
		pod := o.Spec.Template.Spec
		vols := map[string]bool{}
		for _, v := range pod.Volumes {
			vols[v.Name] = true
			if v.Secret != nil && secrets[v.Secret.SecretName] == nil {
				t.Errorf("%s: volume %s names Secret %q, not in the manifests", o.Metadata.Name, v.Name, v.Secret.SecretName)
			}
			if v.PVC != nil && !claims[v.PVC.ClaimName] {
				t.Errorf("%s: volume %s claims %q, not in the manifests", o.Metadata.Name, v.Name, v.PVC.ClaimName)
			}
		}
		for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
			for _, m := range c.VolumeMounts {
				if !vols[m.Name] {
					t.Errorf("%s/%s mounts %q, which is not a volume of its pod", o.Metadata.Name, c.Name, m.Name)
				}
			}
			for _, e := range c.Env {
				if r := e.ValueFrom.SecretKeyRef; r != nil {
					if _, ok := secrets[r.Name][r.Key]; !ok {
						t.Errorf("%s/%s: $%s refers to secret %s key %s, which does not exist", o.Metadata.Name, c.Name, e.Name, r.Name, r.Key)
					}
				}
			}
		}
		for _, c := range pod.Containers {
			if len(c.Args) == 0 || !slices.Contains([]string{"gateway", "worker"}, c.Args[0]) {
				t.Errorf("%s/%s: args %v do not run the gateway or a worker", o.Metadata.Name, c.Name, c.Args)
				continue
			}
			roles[c.Args[0]] = true
			checkArgs(t, o.Metadata.Name+"/"+c.Name, c.Args)
			switch c.Args[0] {
			case "gateway":
				if o.Spec.Replicas == nil || *o.Spec.Replicas != 1 {
					t.Errorf("%s: the gateway must run one replica (SQLite has one writer)", o.Metadata.Name)
				}
				data := flagValue(c.Args, "data")
				onClaim := false
				for _, m := range c.VolumeMounts {
					for _, v := range pod.Volumes {
						if v.Name == m.Name && v.PVC != nil && m.MountPath == data {
							onClaim = true
						}
					}
				}
				if !onClaim {
					t.Errorf("%s: --data %s is not on a PersistentVolumeClaim", o.Metadata.Name, data)
				}
			case "worker":
				if wi := readWorkerImage(t); !strings.HasPrefix(c.Image, wi.name+":") || !slices.Equal(c.Command, wi.entry[:1]) {
					t.Errorf("%s/%s: image %s, command %v; want the worker image (%s, deploy/worker.Dockerfile) and its binary %v",
						o.Metadata.Name, c.Name, c.Image, c.Command, wi.name, wi.entry[:1])
				}
				if c.Resources.Limits["nvidia.com/gpu"] != "1" {
					t.Errorf("%s: the worker asks for no GPU (limits %v)", o.Metadata.Name, c.Resources.Limits)
				}
				hasToken := flagValue(c.Args, "cluster-token-file") != ""
				for _, e := range c.Env {
					hasToken = hasToken || e.Name == "TAILGATE_CLUSTER_TOKEN" && e.ValueFrom.SecretKeyRef != nil
				}
				if !hasToken {
					t.Errorf("%s: the worker gets no cluster token", o.Metadata.Name)
				}
			}
		}
	}
	if !roles["gateway"] || !roles["worker"] {
		t.Errorf("roles found %v; want a gateway and a worker", roles)
	}
	for _, key := range []string{"cluster-token", "tailscale-authkey"} {
		if _, ok := secrets["tailgate"][key]; !ok {
			t.Errorf("the Secret has no %s", key)
		}
	}
}
