package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
)

// subcommand is one verb of a command that has several (keys, tenants,
// workers).
type subcommand struct {
	name string
	run  func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// dispatch runs the subcommand that args[0] names. No subcommand prints the
// usage; -h/--help/help prints it and exits 0; an unknown one prints the
// usage with the error last.
func dispatch(ctx context.Context, cmd, usage string, subs []subcommand, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	var names []string
	for _, s := range subs {
		if s.name == args[0] {
			return s.run(ctx, args[1:], stdout, stderr)
		}
		names = append(names, s.name)
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stderr, usage)
		return flag.ErrHelp
	}
	want := names[0]
	if n := len(names); n > 1 {
		want = strings.Join(names[:n-1], ", ") + " or " + names[n-1]
	}
	fmt.Fprintf(stderr, "%s\ntailgate %s: unknown subcommand %q (want %s)\n", usage, cmd, args[0], want)
	return errUsage
}
