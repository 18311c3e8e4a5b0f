package main

import (
	"context"
	"fmt"
	"io"
)

func cmdVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", "version", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprint(stdout, readBuildInfo().withBinaryHash())
	return nil
}
