package gateway

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The fleet's settings, from flags over the file: a bad one stops the
// gateway with one line naming the flag and the key; a good one picks the
// provider.
func TestFleetSettings(t *testing.T) {
	dir := t.TempDir()
	exe, plain := filepath.Join(dir, "start"), filepath.Join(dir, "notes")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		file     string
		want     string // error; "" for none
		provider string
	}{
		{"unknown provider", []string{"--fleet-provider", "k8s"}, "", `--fleet-provider (fleet.provider) "k8s": want local or exec`, ""},
		{"exec without start", []string{"--fleet-provider", "exec"}, "", "--fleet-provider exec needs --fleet-exec-start PATH (fleet.exec.start): the script that starts a replica", ""},
		{"exec without stop", []string{"--fleet-exec-start", exe}, "", "--fleet-provider exec needs --fleet-exec-stop PATH (fleet.exec.stop): the script that stops a replica", ""},
		{"start missing", []string{"--fleet-exec-start", filepath.Join(dir, "nope"), "--fleet-exec-stop", exe}, "", "--fleet-exec-start (fleet.exec.start) " + filepath.Join(dir, "nope") + ": no such file or directory", ""},
		{"stop not executable", []string{"--fleet-exec-start", exe, "--fleet-exec-stop", plain}, "", "--fleet-exec-stop (fleet.exec.stop) " + plain + ": not an executable file (chmod +x it)", ""},
		{"scripts with local", []string{"--fleet-provider", "local", "--fleet-exec-start", exe}, "", "are for --fleet-provider exec, not local", ""},
		{"bad gateway URL", []string{"--fleet-exec-start", exe, "--fleet-exec-stop", exe, "--fleet-gateway-url", "gw:8081"}, "", `--fleet-gateway-url (fleet.exec.gateway_url) "gw:8081"`, ""},
		{"min above max", nil, "fleet:\n  models:\n    m: {min: 3, max: 2}\n", "fleet.models.m: min 3, max 2: want 0 <= min <= max", ""},
		{"unknown key", nil, "fleet:\n  provder: exec\n", "fleet.provder: unknown key", ""},
		{"scripts by flag: exec", []string{"--fleet-exec-start", exe, "--fleet-exec-stop", exe}, "", "", "exec"},
		{"flag over file", []string{"--fleet-provider", "local"}, "fleet:\n  provider: exec\n", "", "local"},
		{"file's scripts", nil, "fleet:\n  exec: {start: " + exe + ", stop: " + exe + "}\n  models: {m: {max: 2}}\n", "", "exec"},
		{"nothing: local", nil, "", "", "local"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--data", t.TempDir()}, tt.args...)
			if tt.file != "" {
				f := filepath.Join(t.TempDir(), "gateway.yaml")
				if err := os.WriteFile(f, []byte(tt.file), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--config", f)
			}
			var c Config
			fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			c.RegisterFlags(fs)
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			err := c.Load(fs)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Load = %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n")):
				t.Fatalf("Load = %v, want one line with %q", err, tt.want)
			case tt.want == "" && c.Fleet.Provider != tt.provider:
				t.Fatalf("provider %q, want %q", c.Fleet.Provider, tt.provider)
			}
		})
	}
}
