package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestUsageNamesEveryCommand: every command of the table is on the usage
// `tailgate` and `tailgate help` print, every subcommand (keys rotate,
// workers invite, workers approve, …) on its command's line and on the
// usage `tailgate CMD` prints, and each one is dispatched: its -h prints
// its own flags and exits as help does.
func TestUsageNamesEveryCommand(t *testing.T) {
	ctx := context.Background()
	var top, help bytes.Buffer
	if err := run(ctx, nil, &top, &top); !errors.Is(err, errUsage) {
		t.Fatalf("tailgate with no command: %v", err)
	}
	if err := run(ctx, []string{"help"}, &help, &help); err != nil {
		t.Fatal(err)
	}
	for _, c := range commands() {
		for name, out := range map[string]string{"tailgate": top.String(), "tailgate help": help.String()} {
			line := usageLine(out, "tailgate "+c.name+" ")
			if line == "" {
				t.Errorf("%s does not list %s", name, c.name)
				continue
			}
			for _, s := range c.subs {
				if !strings.Contains(line, s.name) {
					t.Errorf("%s lists %s without %s: %q", name, c.name, s.name, line)
				}
			}
		}
		if c.subs == nil {
			continue
		}
		var usage bytes.Buffer
		if err := run(ctx, []string{c.name}, &usage, &usage); !errors.Is(err, errUsage) {
			t.Fatalf("tailgate %s: %v", c.name, err)
		}
		for _, s := range c.subs {
			if usageLine(usage.String(), "tailgate "+c.name+" "+s.name+" ") == "" {
				t.Errorf("tailgate %s's usage does not list %s:\n%s", c.name, s.name, usage.String())
			}
			var out bytes.Buffer
			if err := run(ctx, []string{c.name, s.name, "-h"}, &out, &out); !errors.Is(err, flag.ErrHelp) {
				t.Errorf("tailgate %s %s -h: %v\n%s", c.name, s.name, err, out.String())
			}
			if !strings.Contains(out.String(), "Usage: tailgate "+c.name+" "+s.name) {
				t.Errorf("tailgate %s %s -h prints another command's usage:\n%s", c.name, s.name, out.String())
			}
		}
	}
}

// usageLine returns the line of out that starts (after its indent) with
// prefix, or "".
func usageLine(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l)+" ", prefix) {
			return l
		}
	}
	return ""
}

// TestMistypedCommandsAreSuggested: a command or subcommand one typo away
// is suggested from the same table that dispatches it.
func TestMistypedCommandsAreSuggested(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"gatway"}, `tailgate: unknown command "gatway" (did you mean gateway?)`},
		{[]string{"--verison"}, `tailgate: unknown command "--verison" (did you mean version?)`},
		{[]string{"keys", "rotat"}, `tailgate keys: unknown subcommand "rotat" (want create, list, edit, rotate or revoke) (did you mean rotate?)`},
		{[]string{"workers", "aprove"}, `tailgate workers: unknown subcommand "aprove" (want list, invite, approve, revoke or code) (did you mean approve?)`},
	} {
		var out bytes.Buffer
		if err := run(context.Background(), tc.args, &out, &out); !errors.Is(err, errUsage) {
			t.Errorf("%v: %v", tc.args, err)
		}
		if got := testkit.LastLine(out.String()); got != tc.want {
			t.Errorf("%v: last line %q, want %q", tc.args, got, tc.want)
		}
	}
}

// TestHelpAllPrintsEveryFlagCleanly: --help-all of each command with flags
// lists them without the flag package's "panic calling String method"
// lines (a duration flag that takes days printed one for each).
func TestHelpAllPrintsEveryFlagCleanly(t *testing.T) {
	for _, c := range commands() {
		if c.subs != nil || c.name == "help" || c.name == "version" {
			continue
		}
		var out bytes.Buffer
		err := run(context.Background(), []string{c.name, "--help-all"}, &out, &out)
		if !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s --help-all: %v", c.name, err)
		}
		if strings.Contains(out.String(), "panic") {
			t.Errorf("%s --help-all:\n%s", c.name, out.String())
		}
	}
}
