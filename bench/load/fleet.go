package load

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Fleet is what kill and scaleout phases act on.
type Fleet interface {
	// Kill takes n replicas down abruptly.
	Kill(ctx context.Context, n int) (ActionResult, error)
	// ScaleOut starts n more replicas; it returns once they are starting,
	// not once they are ready.
	ScaleOut(ctx context.Context, n int) (ActionResult, error)
}

// ActionResult is what a fleet reports of an action.
type ActionResult struct {
	// Replicas are the replica ids killed or started; empty when the fleet
	// cannot tell (the report then infers them from what it observed).
	Replicas []string
	// Replacements are replicas started to replace killed ones.
	Replacements []Replacement
	// Output is what a hook printed, for the report.
	Output string
}

// Replacement is a replica started in place of a killed one.
type Replacement struct {
	ID string
	At time.Time
}

// Event is an action as it happened during a run.
type Event struct {
	Kind  PhaseKind
	Count int
	// At is when the action started, Done when the fleet returned; both
	// from the start of the run.
	At, Done time.Duration
	// Replicas are the ids killed or started, as the fleet said or (when
	// Inferred) as the report worked out from what it saw.
	Replicas     []string
	Inferred     bool
	Replacements []EventReplacement
	Output       string
	Err          string
}

// EventReplacement is a replacement started at an offset from the run start.
type EventReplacement struct {
	ID string        `json:"id"`
	At time.Duration `json:"-"`
}

type eventJSON struct {
	Kind         PhaseKind         `json:"kind"`
	Count        int               `json:"count"`
	AtS          float64           `json:"at_s"`
	DoneS        float64           `json:"done_s"`
	Replicas     []string          `json:"replicas"`
	Inferred     bool              `json:"inferred,omitempty"`
	Replacements []replacementJSON `json:"replacements,omitempty"`
	Output       string            `json:"output,omitempty"`
	Err          string            `json:"error,omitempty"`
}

type replacementJSON struct {
	ID  string  `json:"id"`
	AtS float64 `json:"at_s"`
}

func secs(d time.Duration) float64 { return float64(d.Microseconds()) / 1e6 }

// MarshalJSON writes the event with times in seconds.
func (e Event) MarshalJSON() ([]byte, error) {
	j := eventJSON{Kind: e.Kind, Count: e.Count, AtS: secs(e.At), DoneS: secs(e.Done), Replicas: e.Replicas,
		Inferred: e.Inferred, Output: e.Output, Err: e.Err}
	if j.Replicas == nil {
		j.Replicas = []string{}
	}
	for _, r := range e.Replacements {
		j.Replacements = append(j.Replacements, replacementJSON{ID: r.ID, AtS: secs(r.At)})
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (e *Event) UnmarshalJSON(b []byte) error {
	var j eventJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	d := func(s float64) time.Duration { return time.Duration(s * 1e9) }
	*e = Event{Kind: j.Kind, Count: j.Count, At: d(j.AtS), Done: d(j.DoneS), Replicas: j.Replicas, Inferred: j.Inferred,
		Output: j.Output, Err: j.Err}
	for _, r := range j.Replacements {
		e.Replacements = append(e.Replacements, EventReplacement{ID: r.ID, At: d(r.AtS)})
	}
	return nil
}

// Hooks is a Fleet run by user commands, for targets the bench did not start:
// each action runs its command with `sh -c`. The command sees
// TAILGATE_BENCH_EVENT (kill or scaleout), TAILGATE_BENCH_COUNT and the
// variables in Env; it may print the replica ids it acted on, one a line or
// space-separated, on stdout.
type Hooks struct {
	OnKill, OnScaleOut string
	// Timeout bounds one command; 0 means 2 minutes.
	Timeout time.Duration
	// Env is added to the command's environment.
	Env []string
	// Stderr receives the command's stderr; nil discards it.
	Stderr io.Writer
}

// Kill runs OnKill.
func (h *Hooks) Kill(ctx context.Context, n int) (ActionResult, error) {
	return h.run(ctx, h.OnKill, Kill, n)
}

// ScaleOut runs OnScaleOut.
func (h *Hooks) ScaleOut(ctx context.Context, n int) (ActionResult, error) {
	return h.run(ctx, h.OnScaleOut, ScaleOut, n)
}

// ErrNoHook is returned for an action that has no command.
var ErrNoHook = errors.New("no hook command for this action")

func (h *Hooks) run(ctx context.Context, command string, kind PhaseKind, n int) (ActionResult, error) {
	if command == "" {
		return ActionResult{}, ErrNoHook
	}
	timeout := h.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", command)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Kill the whole group on timeout: the hook may have started children.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	cmd.Env = append(append(os.Environ(), "TAILGATE_BENCH_EVENT="+string(kind), "TAILGATE_BENCH_COUNT="+strconv.Itoa(n)), h.Env...)
	var out bytes.Buffer
	cmd.Stdout = &limitedWriter{w: &out, n: 64 << 10}
	if h.Stderr != nil {
		cmd.Stderr = h.Stderr
	}
	err := cmd.Run()
	res := ActionResult{Output: strings.TrimSpace(out.String())}
	for _, f := range strings.Fields(res.Output) {
		if len(f) <= 128 {
			res.Replicas = append(res.Replicas, f)
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%s hook: timed out after %s", kind, timeout)
		} else {
			err = fmt.Errorf("%s hook: %w", kind, err)
		}
		return res, err
	}
	return res, nil
}

type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n <= 0 {
		return len(p), nil
	}
	k := min(len(p), l.n)
	l.n -= k
	_, err := l.w.Write(p[:k])
	return len(p), err
}
