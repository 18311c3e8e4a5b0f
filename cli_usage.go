package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// How a command's flags are shown: -h lists the ones a newcomer needs
// first, grouped; --help-all lists every flag in the same groups. A flag
// or command that does not exist gets the nearest real one suggested.

// flagGroup is one heading of a command's flag list.
type flagGroup struct {
	name  string
	first []string          // shown by -h, in this order (when the command has them)
	owns  func(string) bool // the group's other flags, shown by --help-all
}

func prefixed(ps ...string) func(string) bool {
	return func(name string) bool {
		for _, p := range ps {
			if strings.HasPrefix(name, p) {
				return true
			}
		}
		return false
	}
}

func named(ns ...string) func(string) bool {
	return func(name string) bool { return slices.Contains(ns, name) }
}

// flagGroups are the headings, in the order shown; a flag goes under the
// first group that names it in first or owns it, else under "Other".
var flagGroups = []flagGroup{
	{name: "Tuning", first: []string{"ttft-p99", "e2e-p99", "slo", "rate", "duration", "space", "replay", "out", "check"},
		owns: named("max-error-rate", "max-candidates", "max-duration", "report", "prompt-tokens", "output-tokens", "stream-fraction")},
	{name: "Common", first: []string{"data", "replicas", "engine", "model", "gateway", "cluster-token-file", "join-token-file",
		"replica-id", "upstream", "config", "database", "verbose", "log-level"},
		owns: named("log-format", "cluster-token", "join-token", "price", "served-model-name")},
	{name: "Listeners", first: []string{"listen", "admin-listen", "open-registration", "advertise", "uds"},
		owns: named("max-connections", "max-connections-per-address", "admin-max-connections", "announce", "api-key")},
	{name: "Limits", first: []string{"default-max-tokens", "max-body"},
		owns: prefixed("max-body", "max-json-depth", "media-part-tokens", "admit-", "rejected-rows", "batch-", "sse-keepalive",
			"ttft-deadline", "idle-deadline", "json-deadline", "client-write-timeout", "shutdown-grace", "drain-grace", "startup-timeout")},
	{name: "Hedging and routing", first: []string{"hedge", "policy"},
		owns: prefixed("hedge", "retry-budget", "affinity", "slow-start", "upstream-client")},
	{name: "Mesh", first: []string{"mesh", "mesh-control-url", "mesh-authkey", "mesh-hostname"}, owns: prefixed("mesh")},
	{name: "TLS", first: []string{"tls-cert", "tls-key", "acme-domain"}, owns: prefixed("tls-", "acme-")},
	{name: "Engine", first: []string{"sim-ttft", "sim-tpot", "warmup", "vllm-arg", "gpus"},
		owns: prefixed("sim-", "vllm-", "gpu", "max-num-", "tensor-parallel-size")},
}

// groupedFlags is how many flags a command has before its -h is grouped
// and shortened; fewer are listed whole, as the flag package does.
const groupedFlags = 16

// printFlags writes fs's flags on w: the first of each group and a pointer
// to --help-all, or all of them in their groups when all. A command with
// few flags, or with flags mostly in no group (bench), gets them all in
// one list, as the flag package prints them.
func printFlags(fs *flag.FlagSet, w io.Writer, all bool) {
	var flags []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) { flags = append(flags, f) })
	groups := make([][]*flag.Flag, len(flagGroups)+1) // the last: Other
	for i, g := range flagGroups {
		for _, name := range g.first {
			if f := fs.Lookup(name); f != nil {
				groups[i] = append(groups[i], f)
			}
		}
	}
	rest := make([][]*flag.Flag, len(flagGroups)+1) // the flags -h leaves out
next:
	for _, f := range flags {
		for i, g := range flagGroups {
			if slices.Contains(g.first, f.Name) {
				continue next
			}
			if g.owns(f.Name) {
				rest[i] = append(rest[i], f)
				continue next
			}
		}
		rest[len(flagGroups)] = append(rest[len(flagGroups)], f)
	}
	if len(flags) < groupedFlags || 2*len(rest[len(flagGroups)]) > len(flags) {
		fmt.Fprintln(w, "Flags:")
		printSome(w, flags)
		return
	}
	if all {
		for i := range groups {
			groups[i] = append(groups[i], rest[i]...)
		}
	}
	shown := 0
	if all {
		fmt.Fprintf(w, "Flags (all %d):\n", len(flags))
	} else {
		fmt.Fprintf(w, "Flags to know first (tailgate %s --help-all lists all %d):\n", fs.Name(), len(flags))
	}
	for i, fl := range groups {
		if len(fl) == 0 {
			continue
		}
		name := "Other"
		if i < len(flagGroups) {
			name = flagGroups[i].name
		}
		fmt.Fprintf(w, "\n%s:\n", name)
		printSome(w, fl)
		shown += len(fl)
	}
	if !all && shown < len(flags) {
		fmt.Fprintf(w, "\n%d more flags: tailgate %s --help-all\n", len(flags)-shown, fs.Name())
	}
}

// printSome writes flags as the flag package's PrintDefaults does, in the
// order given.
func printSome(w io.Writer, flags []*flag.Flag) {
	// PrintDefaults sorts by name; one flag at a time keeps the order.
	for _, f := range flags {
		one := flag.NewFlagSet("", flag.ContinueOnError)
		one.SetOutput(w)
		one.Var(f.Value, f.Name, f.Usage)
		one.Lookup(f.Name).DefValue = f.DefValue
		one.PrintDefaults()
	}
}

// wantsHelpAll reports whether args, before a "--", ask for --help-all.
func wantsHelpAll(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "--help-all", "-help-all":
			return true
		}
	}
	return false
}

// didYouMean returns " (did you mean --X?)" for the flag of fs nearest to
// name, or "" when none is near.
func didYouMean(fs *flag.FlagSet, name string) string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	if best := nearest(name, names); best != "" {
		return " (did you mean --" + best + "?)"
	}
	return ""
}

// nearest returns the candidate closest to s by edit distance, when it is
// near enough to be the one meant (at most a third of s's length apart, and
// at least one edit allowed), or one that s is a prefix of; "" otherwise.
func nearest(s string, candidates []string) string {
	sorted := slices.Sorted(slices.Values(candidates))
	best, bestD := "", max(1, len(s)/3)+1
	for _, c := range sorted {
		if d := editDistance(s, c); d < bestD {
			best, bestD = c, d
		}
	}
	if best == "" && len(s) >= 3 {
		for _, c := range sorted {
			if strings.HasPrefix(c, s) {
				return c
			}
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b (a few lines; no
// dependency for a typo hint).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
