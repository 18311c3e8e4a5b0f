package main

import (
	"io"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/server/gateway"
)

// TestREADMEGatewayConfigIsTrue keeps the gateway section of docs/commands.md true:
// every flag it names exists on `tailgate gateway` (the gateway package's
// TestREADMEGatewayConfigExampleLoads checks its YAML example).
func TestREADMEGatewayConfigIsTrue(t *testing.T) {
	raw, err := os.ReadFile("docs/commands.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	start := strings.Index(readme, "## `tailgate gateway`")
	end := strings.Index(readme[start+1:], "\n## ")
	if start < 0 || end < 0 {
		t.Fatal("docs/commands.md has no `tailgate gateway` section")
	}
	section := readme[start : start+1+end]

	var (
		cfg gateway.Config
		lf  logFlags
	)
	fs := gatewayFlagSet(&cfg, &lf, io.Discard)
	names := regexp.MustCompile("`--([a-z0-9-]+)").FindAllStringSubmatch(section, -1)
	if len(names) < 20 {
		t.Fatalf("found only %d flags in the README's gateway section", len(names))
	}
	for _, m := range names {
		if fs.Lookup(m[1]) == nil {
			t.Errorf("README names --%s, which `tailgate gateway` does not have", m[1])
		}
	}
}
