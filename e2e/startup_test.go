package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/mesh/meshtest"
)

// TestStartupErrorsExitWithOneLine runs the binary into each start-up error
// a user can make and checks what they see: exit status 1 and one line
// "tailgate: ..." naming the cause, never a panic or a goroutine dump.
func TestStartupErrorsExitWithOneLine(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	t.Setenv("TS_AUTHKEY", "") // the children inherit it; a key would change the mesh rows
	t.Setenv("TS_AUTH_KEY", "")
	held := holdPort(t)
	regular := filepath.Join(t.TempDir(), "regular")
	if err := os.WriteFile(regular, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "cluster.token")
	if err := os.WriteFile(tokenFile, []byte(testClusterToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	shortToken := filepath.Join(t.TempDir(), "short.token")
	if err := os.WriteFile(shortToken, []byte("tgc-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A data directory whose admin token is short.
	weak := t.TempDir()
	if err := os.WriteFile(filepath.Join(weak, "admin.token"), []byte("tga-12345\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	control := meshtest.StartControl(t, meshtest.RequireAuthKey("tskey-auth-good"))
	// A data directory whose admin token others may read.
	leaky := t.TempDir()
	if err := os.WriteFile(filepath.Join(leaky, "admin.token"), []byte("tga-leaky\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	// A certificate and a key of another certificate.
	certDir := t.TempDir()
	certA, keyA := filepath.Join(certDir, "a.pem"), filepath.Join(certDir, "a.key")
	certB, keyB := filepath.Join(certDir, "b.pem"), filepath.Join(certDir, "b.key")
	newTestCert(t, "a").write(t, certA, keyA)
	newTestCert(t, "b").write(t, certB, keyB)
	keyOpen := filepath.Join(certDir, "open.key") // key A, readable by everyone
	if raw, err := os.ReadFile(keyA); err != nil || os.WriteFile(keyOpen, raw, 0o644) != nil || os.Chmod(keyOpen, 0o644) != nil {
		t.Fatal("write open.key")
	}

	gateway := func(extra ...string) []string {
		return append([]string{"gateway", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, extra...)
	}
	up := func(extra ...string) []string {
		return append([]string{"up", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--replicas", "1"}, extra...)
	}
	worker := func(extra ...string) []string {
		return append([]string{"worker", "--data", t.TempDir(), "--engine", "sim", "--gateway", "http://127.0.0.1:9",
			"--cluster-token-file", tokenFile, "--listen", "127.0.0.1:0"}, extra...)
	}
	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T)
		args    []string
		want    []string // all in the error line
	}{
		{"gateway public port in use", nil, gateway("--listen", held),
			[]string{"--listen " + held, "address already in use"}},
		{"gateway admin port in use", nil, gateway("--admin-listen", held),
			[]string{"--admin-listen " + held, "address already in use"}},
		{"up public port in use", nil, up("--listen", held),
			[]string{"--listen " + held, "address already in use"}},
		{"worker sidecar port in use", nil, worker("--listen", held),
			[]string{"listen " + held, "address already in use"}},
		{"gateway data dir under a regular file", nil, gateway("--data", filepath.Join(regular, "data")),
			[]string{"--data", regular, "not a directory"}},
		{"up data dir under a regular file", nil, up("--data", filepath.Join(regular, "data")),
			[]string{"--data", regular, "not a directory"}},
		{"admin token readable by other users", nil, []string{"gateway", "--data", leaky, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"},
			[]string{"admin.token is readable by other users", "chmod 600"}},
		{"admin token too short", nil, []string{"gateway", "--data", weak, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"},
			[]string{"admin.token is too short", "openssl rand -hex 32", "delete the file"}},
		{"worker cluster token file too short", nil, worker("--cluster-token-file", shortToken),
			[]string{"--cluster-token-file " + shortToken + " is too short", "openssl rand -hex 32"}},
		{"worker cluster token flag too short", nil, worker("--cluster-token-file", "", "--cluster-token", "hunter2"),
			[]string{"cluster token (--cluster-token or TAILGATE_CLUSTER_TOKEN) is too short", "head -c 32 /dev/urandom | base64"}},
		{"--tls-key readable by others", nil, gateway("--tls-cert", certA, "--tls-key", keyOpen),
			[]string{"--tls-key " + keyOpen + " is readable by other users (mode 0644)", "chmod 600 " + keyOpen}},
		{"worker without --gateway", nil, []string{"worker", "--engine", "sim", "--cluster-token", "x"},
			[]string{"--gateway is required"}},
		{"worker on every interface without --advertise", nil, worker("--listen", "0.0.0.0:0"),
			[]string{"--listen 0.0.0.0:0 binds every interface", "--advertise"}},
		{"worker --gateway not a URL", nil, []string{"worker", "--engine", "sim", "--cluster-token", "x", "--gateway", "gw:8081"},
			[]string{`--gateway "gw:8081": want a URL`}},
		{"worker without a cluster token", nil, []string{"worker", "--engine", "sim", "--gateway", "http://127.0.0.1:9"},
			[]string{"a cluster token is required"}},
		{"worker cluster token file missing", nil, worker("--cluster-token-file", "/nonexistent/cluster.token"),
			[]string{"--cluster-token-file", "/nonexistent/cluster.token", "no such file or directory"}},
		{"worker with an unknown engine", nil, worker("--engine", "tgi"),
			[]string{`--engine "tgi": want vllm or sim`}},
		{"worker vllm without --model", nil, worker("--engine", "vllm"),
			[]string{"--model is required with --engine vllm"}},
		{"worker --vllm-arg naming the engine's port", nil, worker("--engine", "vllm", "--model", "m", "--vllm-arg=--port=9"),
			[]string{"--vllm-arg --port: the launcher binds the engine to a Unix socket", "--listen"}},
		{"worker --vllm-arg naming the served model", nil, worker("--engine", "vllm", "--model", "m",
			"--vllm-arg", "--served-model-name", "--vllm-arg", "x"),
			[]string{"--vllm-arg --served-model-name: use tailgate worker's --served-model-name instead"}},
		{"up --vllm-arg naming the served model", nil, up("--engine", "vllm", "--model", "m", "--vllm-arg=--served_model_name=x"),
			[]string{"--vllm-arg --served-model-name: use tailgate worker's --served-model-name instead"}},
		{"worker negative --warmup", nil, worker("--warmup", "-1"),
			[]string{"--warmup -1"}},
		{"worker tailnet port it cannot listen on", nil, worker("--mesh", "--mesh-control-url", control, "--mesh-ephemeral",
			"--mesh-authkey", "tskey-auth-good", "--listen", "127.0.0.1:99999"),
			[]string{"sidecar listen on the tailnet :99999"}},
		{"--mesh-allow-peers without --mesh", nil, gateway("--mesh-allow-peers", "tg-w1"),
			[]string{"--mesh-allow-peers needs --mesh"}},
		{"--tls-cert without --tls-key", nil, gateway("--tls-cert", certA),
			[]string{"--tls-cert needs --tls-key"}},
		{"--tls-key without --tls-cert", nil, up("--tls-key", keyA),
			[]string{"--tls-key needs --tls-cert"}},
		{"--tls-cert file missing", nil, gateway("--tls-cert", "/nonexistent/cert.pem", "--tls-key", keyA),
			[]string{"--tls-cert", "/nonexistent/cert.pem", "no such file or directory"}},
		{"--tls-key unreadable (a directory)", nil, gateway("--tls-cert", certA, "--tls-key", certDir),
			[]string{"--tls-key", certDir, "is a directory"}},
		{"--tls-key of another certificate", nil, up("--tls-cert", certA, "--tls-key", keyB),
			[]string{"--tls-cert " + certA, "--tls-key " + keyB, "private key does not match public key"}},
		{"--tls-cert that is not PEM", nil, gateway("--tls-cert", regular, "--tls-key", keyA),
			[]string{"--tls-cert " + regular, "failed to find any PEM data"}},
		{"own certificate and ACME both", nil, gateway("--tls-cert", certA, "--tls-key", keyA, "--acme-domain", "api.example.com"),
			[]string{"--tls-cert and --acme-domain", "give one"}},
		{"--acme-email without --acme-domain", nil, gateway("--acme-email", "ops@example.com"),
			[]string{"--acme-email needs --acme-domain"}},
		{"--acme-domain with a scheme", nil, gateway("--acme-domain", "https://api.example.com"),
			[]string{`--acme-domain "https://api.example.com"`, "without scheme"}},
		{"--acme-domain an IP address", nil, up("--acme-domain", "api.example.com,10.0.0.5"),
			[]string{`--acme-domain "api.example.com,10.0.0.5": 10.0.0.5: want a domain name, not an IP address`}},
		{"--acme-directory not https", nil, gateway("--acme-domain", "api.example.com", "--acme-directory", "http://ca.internal/dir"),
			[]string{`--acme-directory "http://ca.internal/dir"`, "https URL"}},
		{"--acme-ca-cert without a certificate in it", nil, gateway("--acme-domain", "api.example.com", "--acme-ca-cert", regular),
			[]string{"--acme-ca-cert " + regular, "no PEM certificate"}},
		{"gateway mesh key refused", nil, gateway("--mesh", "--mesh-control-url", control, "--mesh-ephemeral", "--mesh-authkey", "tskey-auth-bad"),
			[]string{"refused", "invalid authkey", "--mesh-authkey"}},
		{"worker mesh key refused", nil, worker("--mesh", "--mesh-control-url", control, "--mesh-ephemeral", "--mesh-authkey", "tskey-auth-bad"),
			[]string{"refused", "invalid authkey", "--mesh-authkey"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.prepare != nil {
				tc.prepare(t)
			}
			code, stderr := runToExit(t, 90*time.Second, tc.args...)
			if code != 1 {
				t.Errorf("exit status %d, want 1", code)
			}
			if strings.Contains(stderr, "panic") || strings.Contains(stderr, "goroutine ") {
				t.Errorf("stderr has a panic or a goroutine dump")
			}
			line := errorLine(t, stderr)
			for _, w := range tc.want {
				if !strings.Contains(line, w) {
					t.Errorf("error line lacks %q", w)
				}
			}
			if t.Failed() {
				t.Logf("tailgate %s\nstderr:\n%s", strings.Join(tc.args, " "), stderr)
			}
		})
	}
}

// joinOnce returns a step that starts the gateway with args, waits until it
// serves, and stops it.
func joinOnce(args []string) func(t *testing.T) {
	return func(t *testing.T) {
		p := startProc(t, "gateway (first start)", true, args...)
		bound := time.AfterFunc(60*time.Second, func() { _ = p.Stop(0) })
		defer bound.Stop()
		served := false
		p.scanUntil(func(line string) bool {
			served = strings.HasPrefix(line, "tailgate gateway: API")
			return served
		})
		if !served {
			t.Fatalf("the gateway did not start:\n%s", p.stderr.String())
		}
		_ = p.Stop(10 * time.Second) // a clean stop: the node's state is on disk for the second start
	}
}

// TestRefusedTagsStopTheGateway: a gateway that asks the control server for
// tags it may not have fails at once with one line naming the tags. The test
// control server refuses a registered node that asks for new tags by
// expiring its key; on a loaded machine it sometimes lets the second start
// up first (it trusts the tags a node asks for when it signs up, so the node
// joins once with a tag, then again with one nobody owns), so the scenario
// gets three tries, each on a fresh node (the
// gateway must fail on one of them, and say why).
func TestRefusedTagsStopTheGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	t.Setenv("TS_AUTHKEY", "")
	t.Setenv("TS_AUTH_KEY", "")
	control := meshtest.StartControl(t, meshtest.RequireAuthKey("tskey-auth-good"))
	for attempt := 1; ; attempt++ {
		dir := t.TempDir()
		retag := func(tag string) []string {
			return []string{"gateway", "--data", dir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
				"--mesh", "--mesh-control-url", control, "--mesh-authkey", "tskey-auth-good", "--mesh-tags", tag}
		}
		joinOnce(retag(meshtest.TagGateway))(t)
		code, stderr, ran := runUntil(t, 30*time.Second, retag("tag:nobody-owns")...)
		if !ran {
			if attempt < 3 {
				t.Logf("attempt %d: the control server let the re-tagged node up; trying a fresh node", attempt)
				continue
			}
			t.Fatalf("the gateway kept running with refused tags in 3 tries; stderr:\n%s", stderr)
		}
		if code != 1 || strings.Contains(stderr, "panic") || strings.Contains(stderr, "goroutine ") {
			t.Fatalf("exit status %d; stderr:\n%s", code, stderr)
		}
		line := errorLine(t, stderr)
		for _, w := range []string{"refused", "expired the node's key", "tag:nobody-owns", "--mesh-tags", "tagOwners", "preauthkeys create --tags"} {
			if !strings.Contains(line, w) {
				t.Errorf("error line lacks %q: %s", w, line)
			}
		}
		return
	}
}

// errorLine returns the one line of stderr that reports the error: it
// starts with "tailgate: " and is the last line (log lines come before).
func errorLine(t *testing.T, stderr string) string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	var n int
	for _, l := range lines {
		if strings.HasPrefix(l, "tailgate: ") {
			n++
		}
	}
	last := lines[len(lines)-1]
	if n != 1 || !strings.HasPrefix(last, "tailgate: ") {
		t.Errorf("want exactly one error line, \"tailgate: ...\", last on stderr; got %d", n)
	}
	return last
}

// testClusterToken is a cluster token long enough to be accepted
// (policy.CheckToken) for tests that need one in a file.
const testClusterToken = "tgc-6f1c0a7d9e2b4c3a8f5d1e0b7a6c9d2e4f3b8a1c5d7e9f0a2b4c6d8e1f3a5b7c"
