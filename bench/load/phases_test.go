package load

import (
	"reflect"
	"testing"
	"time"
)

func TestParsePhasesFromTheIssue(t *testing.T) {
	ps, err := ParsePhases("steady:30s,burst:10s:x3,kill:1,steady:20s,scaleout:1,steady:20s")
	if err != nil {
		t.Fatal(err)
	}
	want := []Phase{
		{Kind: Steady, Duration: 30 * time.Second, Factor: 1},
		{Kind: Burst, Duration: 10 * time.Second, Factor: 3},
		{Kind: Kill, Count: 1},
		{Kind: Steady, Duration: 20 * time.Second, Factor: 1},
		{Kind: ScaleOut, Count: 1},
		{Kind: Steady, Duration: 20 * time.Second, Factor: 1},
	}
	if !reflect.DeepEqual(ps, want) {
		t.Fatalf("got %+v", ps)
	}
	if s := FormatPhases(ps); s != "steady:30s,burst:10s:x3,kill:1,steady:20s,scaleout:1,steady:20s" {
		t.Fatalf("formatted back as %q", s)
	}
	plan, err := NewPlan(ps)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Length != 80*time.Second || len(plan.Spans) != 4 {
		t.Fatalf("plan length %v, %d spans", plan.Length, len(plan.Spans))
	}
	wantActions := []Action{{Kind: Kill, Count: 1, At: 40 * time.Second}, {Kind: ScaleOut, Count: 1, At: 60 * time.Second}}
	if !reflect.DeepEqual(plan.Actions, wantActions) {
		t.Fatalf("actions %+v", plan.Actions)
	}
	names := []string{"1 steady", "2 burst x3", "3 steady", "4 steady"}
	for i, s := range plan.Spans {
		if s.Name != names[i] {
			t.Errorf("span %d named %q, want %q", i, s.Name, names[i])
		}
	}
	for at, want := range map[time.Duration]int{0: 0, 29 * time.Second: 0, 30 * time.Second: 1, 45 * time.Second: 2, 79 * time.Second: 3, 99 * time.Second: 3} {
		if got := plan.SpanAt(at); got != want {
			t.Errorf("SpanAt(%v) = %d, want %d", at, got, want)
		}
	}
}

func TestParsePhasesForms(t *testing.T) {
	ps, err := ParsePhases(" idle:500ms , burst:1s:2.5x,kill,scaleout:3 ")
	if err != nil {
		t.Fatal(err)
	}
	want := []Phase{{Kind: Idle, Duration: 500 * time.Millisecond}, {Kind: Burst, Duration: time.Second, Factor: 2.5},
		{Kind: Kill, Count: 1}, {Kind: ScaleOut, Count: 3}}
	if !reflect.DeepEqual(ps, want) {
		t.Fatalf("got %+v", ps)
	}
}

func TestParsePhasesRejects(t *testing.T) {
	for _, bad := range []string{"", "steady", "steady:0s", "steady:-1s", "steady:10", "burst:10s", "burst:10s:x0",
		"burst:10s:xx", "kill:0", "kill:a", "scaleout:1:2", "pause:1s", "steady:1s:2"} {
		if _, err := ParsePhases(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	ps, _ := ParsePhases("kill:1,scaleout:1")
	if _, err := NewPlan(ps); err == nil {
		t.Error("a plan of actions only was accepted")
	}
	ps, _ = ParsePhases("steady:13h,steady:12h")
	if _, err := NewPlan(ps); err == nil {
		t.Error("a plan longer than a day was accepted")
	}
}
