package main

import (
	"bytes"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/server/gateway"
)

// TestSecretFlagsComeFromTheEnvironment: each secret-bearing flag takes its
// TAILGATE_* variable when the command line does not give it; a flag on
// the command line (or the file flag holding the same secret) wins, and a
// secret from the environment draws no "visible on the command line"
// warning.
func TestSecretFlagsComeFromTheEnvironment(t *testing.T) {
	env := map[string]string{
		"TAILGATE_CLUSTER_TOKEN": "tgc-env", "TAILGATE_MESH_AUTHKEY": "tskey-env",
		"TAILGATE_API_KEY": "sk-env", "TAILGATE_API_KEY_B": "sk-env-b", "TAILGATE_JOIN_TOKEN": "tgj-env",
	}
	type result struct{ clusterToken, meshKey, benchKey, benchKeyB, joinToken string }
	parse := func(t *testing.T, cmd string, args ...string) (result, string) {
		t.Helper()
		fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var (
			wf workerFlags
			gc gateway.Config
			bf benchFlags
		)
		switch cmd {
		case "worker":
			wf.register(fs)
		case "gateway":
			gc.RegisterFlags(fs)
			gc.RegisterMeshFlags(fs)
		case "bench":
			bf.register(fs)
		}
		if err := parseFlags(fs, args); err != nil {
			t.Fatal(err)
		}
		if err := secretsFromEnv(fs, func(k string) string { return env[k] }); err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		warnSecretFlags(slog.New(slog.NewTextHandler(&logs, nil)), fs, "cluster-token", "join-token", "mesh-authkey")
		return result{wf.clusterToken, wf.mesh.AuthKey + gc.Mesh.AuthKey, bf.opts.A.Key, bf.opts.B.Key, wf.joinToken}, logs.String()
	}
	for _, tc := range []struct {
		name string
		cmd  string
		args []string
		want result
		warn bool
	}{
		{"worker: all from the environment", "worker", nil, result{clusterToken: "tgc-env", meshKey: "tskey-env", joinToken: "tgj-env"}, false},
		{"worker: the flag wins", "worker", []string{"--cluster-token", "tgc-flag", "--mesh-authkey", "tskey-flag", "--join-token", "tgj-flag"},
			result{clusterToken: "tgc-flag", meshKey: "tskey-flag", joinToken: "tgj-flag"}, true},
		{"worker: the token files win", "worker", []string{"--cluster-token-file", "/etc/tailgate/cluster.token", "--join-token-file", "/etc/tailgate/join.token"},
			result{meshKey: "tskey-env"}, false},
		{"gateway: mesh key from the environment", "gateway", nil, result{meshKey: "tskey-env"}, false},
		{"bench: keys from the environment", "bench", nil, result{benchKey: "sk-env", benchKeyB: "sk-env-b"}, false},
		{"bench: key files win", "bench", []string{"--key-file", "k", "--key-file-b", "kb"}, result{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, logs := parse(t, tc.cmd, tc.args...)
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if warned := strings.Contains(logs, "visible to every user"); warned != tc.warn {
				t.Errorf("warned about a secret on the command line: %v, want %v; log:\n%s", warned, tc.warn, logs)
			}
			if strings.Contains(logs, "-env") || strings.Contains(logs, "-flag") {
				t.Errorf("a log line holds the secret:\n%s", logs)
			}
		})
	}
}
