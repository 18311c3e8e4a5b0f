package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestParseDurationTakesDays: every duration the CLI reads takes days as
// well as Go's units; anything else is refused with one line naming the
// value and examples.
func TestParseDurationTakesDays(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"7d", 7 * 24 * time.Hour},
		{"1.5d", 36 * time.Hour},
		{"1d12h", 36 * time.Hour},
		{"0d", 0},
		{"90s", 90 * time.Second},
		{"1h30m", 90 * time.Minute},
		{"250ms", 250 * time.Millisecond},
		{" 30d ", 30 * 24 * time.Hour},
	} {
		got, err := parseDuration(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("parseDuration(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "7", "d", "7dd", "-1d", "1e3d", "7x", "1d-2h", "1d+2h", "soon"} {
		if d, err := parseDuration(bad); err == nil {
			t.Errorf("parseDuration(%q) = %v, want an error", bad, d)
		} else if !strings.Contains(err.Error(), "7d") {
			t.Errorf("parseDuration(%q): %v; the error should give examples", bad, err)
		}
	}
}

// TestEveryDurationFlagTakesDays: a duration flag registered by any
// package (here the flag package's own, as the gateway config, the sim
// knobs and the commands register theirs) takes `7d` through parseArgs,
// and -h still calls it a duration.
func TestEveryDurationFlagTakesDays(t *testing.T) {
	var help bytes.Buffer
	fs := newFlagSet("x", "x", &help)
	d := fs.Duration("window", time.Second, "a window")
	n := fs.Int("n", 1, "a number")
	if _, err := parseArgs(fs, []string{"--window", "2d", "--n", "3"}, 0); err != nil {
		t.Fatal(err)
	}
	if *d != 48*time.Hour || *n != 3 {
		t.Errorf("--window 2d --n 3 gave %v, %d", *d, *n)
	}
	if _, err := parseArgs(fs, []string{"-h"}, 0); err != flag.ErrHelp {
		t.Fatalf("-h: %v", err)
	}
	if !strings.Contains(help.String(), "-window duration") {
		t.Errorf("-h no longer names the type:\n%s", help.String())
	}
	help.Reset()
	if _, err := parseArgs(fs, []string{"--window", "2x"}, 0); err != errUsage {
		t.Fatalf("--window 2x: %v, want a usage error", err)
	}
	if !strings.Contains(help.String(), `"2x" is not a duration`) {
		t.Errorf("--window 2x:\n%s", help.String())
	}
}

// TestUsageSinceTakesDays: `usage --since 7d` is answered (it was refused
// while `keys --expires 30d` worked), and a bad --since is one usage
// error line naming both forms.
func TestUsageSinceTakesDays(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	if err := run(ctx, []string{"init", "--data", dir}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := run(ctx, []string{"usage", "--data", dir, "--since", "7d", "--json"}, &out, &errOut); err != nil {
		t.Fatalf("usage --since 7d: %v\n%s", err, errOut.String())
	}
	if strings.TrimSpace(out.String()) != "[]" {
		t.Errorf("usage of an empty deployment: %q", out.String())
	}
	errOut.Reset()
	if err := run(ctx, []string{"usage", "--data", dir, "--since", "a week"}, &out, &errOut); err != errUsage {
		t.Fatalf("usage --since 'a week': %v", err)
	}
	last := testkit.LastLine(errOut.String())
	if want := `tailgate usage: --since: time "a week": want a date (2026-11-01), a time in RFC 3339 (2026-11-01T00:00:00Z) or a duration ago (7d, 24h)`; last != want {
		t.Errorf("last line %q\nwant      %q", last, want)
	}
}
