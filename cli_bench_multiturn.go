package main

import (
	"flag"
	"strings"

	"github.com/tailgate-dev/tailgate/bench/load"
)

// registerMultiturn binds the multiturn scenario's flags.
func registerMultiturn(fs *flag.FlagSet, o *load.MultiturnOptions) {
	fs.IntVar(&o.Conversations, "conversations", 0, "multiturn: conversations running at once (default 24)")
	fs.StringVar(&o.Turns, "turns", "", "multiturn: turns per conversation, N, uniform:MIN:MAX or lognormal:MEDIAN:SPREAD (default uniform:4:12)")
	fs.StringVar(&o.Growth, "context-growth", "", "multiturn: prompt tokens each turn after the first adds (default lognormal:250:0.6)")
	fs.StringVar(&o.FirstTurn, "first-turn-tokens", "", "multiturn: tokens of a conversation's first message (default lognormal:300:0.5)")
	fs.IntVar(&o.System, "system-tokens", 0, "multiturn: tokens of each agent's system prompt (default 1500)")
	fs.IntVar(&o.Agents, "agents", 0, "multiturn: different system prompts the conversations share (default 4)")
	fs.DurationVar(&o.Think, "think", 0, "multiturn: mean pause between an answer and the next turn (default 300ms)")
	fs.DurationVar(&o.Duration, "multiturn-duration", 0, "multiturn: how long each affinity mode runs (default 20s)")
	fs.StringVar(&o.SessionHeader, "session-header", "", "multiturn: name each conversation by a coding agent's session header, claude-code, codex or opencode, instead of prompt_cache_key (default none)")
	fs.Func("affinity-modes", "multiturn: gateway --affinity modes to run, comma-separated (default off,prefix,session)", func(s string) error {
		o.Modes = nil
		for m := range strings.SplitSeq(s, ",") {
			if m = strings.TrimSpace(m); m != "" {
				o.Modes = append(o.Modes, m)
			}
		}
		return nil
	})
}
