package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"tailgate/data"
	"tailgate/server/gateway"
)

// The helpers more than one command uses, beside main.go's flag parsing:
// secrets from the environment, opening a deployment's database, printing.

// secretEnv lists the flags that carry a secret and the environment
// variable that supplies each when the command line does not: a flag is
// visible to every user of the box (ps, /proc/PID/cmdline) and stays in
// shell history; the environment is not (systemd's EnvironmentFile=,
// Kubernetes' secretKeyRef). The flag wins, and so does any flag of
// unless (a file that holds the same secret).
var secretEnv = []struct {
	flag, env string
	unless    []string
}{
	{"cluster-token", "TAILGATE_CLUSTER_TOKEN", []string{"cluster-token-file"}},
	{"mesh-authkey", "TAILGATE_MESH_AUTHKEY", nil},
	{"key", "TAILGATE_API_KEY", []string{"key-file"}},
	{"key-b", "TAILGATE_API_KEY_B", []string{"key-file-b"}},
}

// secretsFromEnv sets each secret flag of fs that its command line left out
// from its environment variable (looked up by getenv). It sets the value,
// not the flag: flagGiven and warnSecretFlags still see only the command
// line.
func secretsFromEnv(fs *flag.FlagSet, getenv func(string) string) error {
	for _, s := range secretEnv {
		f := fs.Lookup(s.flag)
		if f == nil || flagGiven(fs, s.flag) || slices.ContainsFunc(s.unless, func(n string) bool { return flagGiven(fs, n) }) {
			continue
		}
		if v := strings.TrimSpace(getenv(s.env)); v != "" {
			if err := f.Value.Set(v); err != nil {
				return fmt.Errorf("$%s (for --%s): %w", s.env, s.flag, err)
			}
		}
	}
	return nil
}

// flagGiven reports whether the flag name was set on fs's command line.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// warnSecretFlags warns about secrets given as command-line flags: any
// user of the box can read them in ps and /proc, and shells keep them in
// their history. Files and environment variables do not leak that way.
func warnSecretFlags(log *slog.Logger, fs *flag.FlagSet, names ...string) {
	fs.Visit(func(f *flag.Flag) {
		for _, n := range names {
			if f.Name == n && f.Value.String() != "" {
				alt := map[string]string{"cluster-token": "--cluster-token-file or TAILGATE_CLUSTER_TOKEN in the environment", "mesh-authkey": "TAILGATE_MESH_AUTHKEY (or TS_AUTHKEY) in the environment"}[n]
				log.Warn("a secret on the command line is visible to every user of this box (ps, /proc); prefer "+alt, "flag", "--"+n)
			}
		}
	})
}

// openCommand finishes the prelude of a command on an existing deployment:
// it parses args with fs (which defines --data into dir), takes the one
// positional argument named want (none when want is ""), and opens the
// deployment's store, which the caller closes.
func openCommand(fs *flag.FlagSet, stderr io.Writer, args []string, dir *string, want string) (*data.Store, string, error) {
	var arg string
	if want == "" {
		if err := parseFlags(fs, args); err != nil {
			return nil, "", err
		}
	} else {
		pos, err := parseArgs(fs, args, 1)
		if err != nil {
			return nil, "", err
		}
		if len(pos) != 1 || pos[0] == "" {
			return nil, "", usageError(fs, stderr, fs.Usage, errors.New("want the "+want))
		}
		arg = pos[0]
	}
	st, err := openStore(*dir)
	return st, arg, err
}

// openStore opens the database of an existing deployment in dir.
func openStore(dir string) (*data.Store, error) {
	db, err := gateway.ExistingDatabase(dir)
	if err != nil {
		return nil, err
	}
	return data.Open(db)
}

func keyStatus(k data.Key, now time.Time) string {
	switch {
	case k.Revoked():
		return "revoked"
	case k.ExpiredAt(now):
		return "expired"
	}
	return "active"
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// isTerminal tells whether w is a terminal, where progress is rewritten in
// place and a secret link may be shown.
func isTerminal(w io.Writer) bool {
	fl, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := fl.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
