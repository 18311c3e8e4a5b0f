package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
)

// One table of commands (commands, in main.go) drives dispatch, the usage
// text, the did-you-mean for a mistyped command and the command list of
// `tailgate help`, as tailscale's cmd/tailscale/cli/cli.go and caddy's
// cmd/commands.go do; a command added there is listed, dispatched and
// suggested, and TestUsageNamesEveryCommand fails for one printed nowhere.

// runFunc is what a command or subcommand runs with the arguments after its
// name.
type runFunc func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// command is one command of the table, or one subcommand of a command with
// several (keys, tenants, workers).
type command struct {
	name     string
	aliases  []string // other spellings that run it (version: --version)
	synopsis string   // what follows the name on the usage line: flags and arguments
	short    string   // what it does, one line
	run      runFunc  // nil for a command with subs
	subs     []command
	notes    string // a paragraph after the subcommands' lines
}

// run dispatches args to the command of the table that args[0] names.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmds := commands()
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText(cmds))
		return errUsage
	}
	switch args[0] {
	case "-h", "-help", "--help":
		fmt.Fprint(stdout, usageText(cmds))
		return nil
	}
	c, ok := lookup(cmds, args[0])
	if !ok {
		fmt.Fprintf(stderr, "%s\ntailgate: unknown command %q%s\n", usageText(cmds), args[0], suggest(cmds, args[0]))
		return errUsage
	}
	return c.dispatch(ctx, "tailgate "+c.name, args[1:], stdout, stderr)
}

// lookup returns the command of cmds named (or aliased) name.
func lookup(cmds []command, name string) (command, bool) {
	for _, c := range cmds {
		if c.name == name {
			return c, true
		}
		for _, a := range c.aliases {
			if a == name {
				return c, true
			}
		}
	}
	return command{}, false
}

// dispatch runs c, or the subcommand of c that args[0] names. No
// subcommand prints c's usage; -h/--help/help prints it and exits 0; an
// unknown one prints the usage with the error last.
func (c command) dispatch(ctx context.Context, path string, args []string, stdout, stderr io.Writer) error {
	if c.subs == nil {
		return c.run(ctx, args, stdout, stderr)
	}
	usage := c.usage(path)
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	if s, ok := lookup(c.subs, args[0]); ok {
		return s.dispatch(ctx, path+" "+s.name, args[1:], stdout, stderr)
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stderr, usage)
		return flag.ErrHelp
	}
	names := c.subNames()
	want := names[0]
	if n := len(names); n > 1 {
		want = strings.Join(names[:n-1], ", ") + " or " + names[n-1]
	}
	fmt.Fprintf(stderr, "%s\n%s: unknown subcommand %q (want %s)%s\n", usage, path, args[0], want, suggest(c.subs, args[0]))
	return errUsage
}

func (c command) subNames() []string {
	names := make([]string, len(c.subs))
	for i, s := range c.subs {
		names[i] = s.name
	}
	return names
}

// usage is the usage of a command with subcommands: one line each, the
// notes, and where their flags are.
func (c command) usage(path string) string {
	var b strings.Builder
	b.WriteString("Usage:\n")
	width := 0
	for _, s := range c.subs {
		width = max(width, len(s.name))
	}
	for _, s := range c.subs {
		line := fmt.Sprintf("  %s %-*s %s", path, width, s.name, s.synopsis)
		if s.short != "" {
			line += "   (" + s.short + ")"
		}
		b.WriteString(strings.TrimRight(line, " ") + "\n")
	}
	if c.notes != "" {
		b.WriteString("\n" + c.notes)
	}
	fmt.Fprintf(&b, "\nRun '%s SUBCOMMAND -h' for its flags.\n", path)
	return b.String()
}

// usageText is what `tailgate`, `tailgate -h` and `tailgate help` print:
// a line for each command of the table.
func usageText(cmds []command) string {
	var b strings.Builder
	b.WriteString("tailgate — an OpenAI-compatible LLM gateway with a tail-latency budget\n\nUsage:\n")
	for _, c := range cmds {
		synopsis := c.synopsis
		if c.subs != nil {
			synopsis = strings.Join(c.subNames(), "|") + " [flags]"
		}
		head := strings.TrimRight(fmt.Sprintf("%-8s %s", c.name, synopsis), " ")
		fmt.Fprintf(&b, "  tailgate %-18s   %s\n", head, c.short)
	}
	b.WriteString("\nRun 'tailgate COMMAND -h' for the flags of a command.\n")
	return b.String()
}

// suggest returns " (did you mean X?)" for the command of cmds nearest to
// name, or "" when none is near.
func suggest(cmds []command, name string) string {
	var names []string
	for _, c := range cmds {
		names = append(names, c.name)
	}
	if best := nearest(strings.TrimLeft(name, "-"), names); best != "" {
		return " (did you mean " + best + "?)"
	}
	return ""
}
