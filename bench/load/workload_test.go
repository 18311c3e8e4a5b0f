package load

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func mustDist(t *testing.T, s string) Dist {
	t.Helper()
	d, err := ParseDist(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func testWorkload(t *testing.T, seed int64) *Workload {
	t.Helper()
	w, err := NewWorkload(WorkloadConfig{Model: "m", Prompt: mustDist(t, "lognormal:256:0.6"), Output: mustDist(t, "lognormal:64:0.5"),
		StreamFraction: 0.5, IgnoreEOS: true, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestSameSeedSameRequests(t *testing.T) {
	a, b, other := testWorkload(t, 7), testWorkload(t, 7), testWorkload(t, 8)
	differ := 0
	streams := 0
	for i := range 300 {
		ra, rb, ro := a.Request(i), b.Request(i), other.Request(i)
		if !bytes.Equal(ra.Body, rb.Body) || ra.Stream != rb.Stream || ra.PromptTokens != rb.PromptTokens || ra.MaxTokens != rb.MaxTokens {
			t.Fatalf("request %d differs between two workloads with seed 7", i)
		}
		if !bytes.Equal(ra.Body, ro.Body) {
			differ++
		}
		if ra.Stream {
			streams++
		}
	}
	if differ < 290 {
		t.Fatalf("only %d of 300 requests differ between seeds 7 and 8", differ)
	}
	if streams < 100 || streams > 200 {
		t.Fatalf("%d of 300 requests stream with a fraction of 0.5", streams)
	}
	// Request i does not depend on which requests were drawn before it.
	if !bytes.Equal(testWorkload(t, 7).Request(250).Body, a.Request(250).Body) {
		t.Fatal("request 250 depends on the order of draws")
	}
}

func TestSameSeedSameSchedule(t *testing.T) {
	ps, _ := ParsePhases("steady:10s,burst:5s:x3,kill:1,idle:2s,steady:10s")
	plan, _ := NewPlan(ps)
	a, b, c := OpenLoop(plan, 20, 1), OpenLoop(plan, 20, 1), OpenLoop(plan, 20, 2)
	if !slices.Equal(a, b) {
		t.Fatal("two schedules with the same seed differ")
	}
	if slices.Equal(a, c) {
		t.Fatal("schedules with seeds 1 and 2 are the same")
	}
	perSpan := map[int]int{}
	for i, ar := range a {
		if ar.Index != i || (i > 0 && ar.At < a[i-1].At) {
			t.Fatalf("arrival %d out of order: %+v", i, ar)
		}
		s := plan.Spans[ar.Span]
		if ar.At < s.Start || ar.At >= s.End {
			t.Fatalf("arrival %+v outside its span %+v", ar, s)
		}
		perSpan[ar.Span]++
	}
	// Poisson counts: steady 10s at 20/s ≈ 200, burst 5s at 60/s ≈ 300, idle none.
	if n := perSpan[0]; n < 150 || n > 250 {
		t.Errorf("steady phase has %d arrivals, want about 200", n)
	}
	if n := perSpan[1]; n < 240 || n > 360 {
		t.Errorf("burst phase has %d arrivals, want about 300", n)
	}
	if n := perSpan[2]; n != 0 {
		t.Errorf("idle phase has %d arrivals", n)
	}
}

func TestDistributions(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	ln := mustDist(t, "lognormal:256:0.6")
	draws := make([]float64, 10001)
	for i := range draws {
		draws[i] = float64(ln.Draw(r))
	}
	s := Summarize(draws)
	if s.P50 < 243 || s.P50 > 269 {
		t.Errorf("lognormal:256:0.6 median %v, want 256 ± 5%%", s.P50)
	}
	// exp(0.6 × 1.645) ≈ 2.68: the p95 of the spread.
	if s.P95 < 256*2.4 || s.P95 > 256*3.0 {
		t.Errorf("lognormal:256:0.6 p95 %v, want about %v", s.P95, 256*2.68)
	}
	u := mustDist(t, "uniform:10:12")
	seen := map[int]bool{}
	for range 1000 {
		v := u.Draw(r)
		if v < 10 || v > 12 {
			t.Fatalf("uniform:10:12 drew %d", v)
		}
		seen[v] = true
	}
	if len(seen) != 3 {
		t.Errorf("uniform:10:12 drew %v", seen)
	}
	if v := mustDist(t, "128").Draw(r); v != 128 {
		t.Errorf("fixed 128 drew %d", v)
	}
	if v := mustDist(t, "fixed:5").Draw(r); v != 5 {
		t.Errorf("fixed:5 drew %d", v)
	}
	for _, bad := range []string{"", "x", "-3", "0", "lognormal:256", "lognormal:0:1", "lognormal:10:9", "uniform:5:2", "normal:1:2"} {
		if _, err := ParseDist(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestPromptLengthMatchesTheSimulatedEngine: the simulated engine counts a
// chat prompt as 3 + Σ(4 + ⌈bytes/4⌉) over messages (README); the drawn
// prompt length is what it reports.
func TestPromptLengthMatchesTheSimulatedEngine(t *testing.T) {
	w := testWorkload(t, 1)
	for i := range 200 {
		req := w.Request(i)
		var body struct {
			Model     string `json:"model"`
			MaxTokens int    `json:"max_tokens"`
			IgnoreEOS bool   `json:"ignore_eos"`
			Stream    bool   `json:"stream"`
			Messages  []struct {
				Role, Content string
			} `json:"messages"`
		}
		if err := json.Unmarshal(req.Body, &body); err != nil {
			t.Fatal(err)
		}
		if body.Model != "m" || body.MaxTokens != req.MaxTokens || !body.IgnoreEOS || body.Stream != req.Stream || req.Path != "/chat/completions" {
			t.Fatalf("request %d body %s", i, req.Body)
		}
		simCount := 3
		for _, m := range body.Messages {
			simCount += 4 + (len(m.Content)+3)/4
		}
		if req.PromptTokens >= 8 && simCount != req.PromptTokens {
			t.Fatalf("request %d: drew %d prompt tokens, the simulated engine counts %d", i, req.PromptTokens, simCount)
		}
	}
}

func TestReplay(t *testing.T) {
	in := strings.NewReader(`# two bodies and a length line
{"model":"x","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}

{"prompt":"once upon","max_tokens":3}
{"prompt_tokens":100,"output_tokens":20,"stream":false}
`)
	entries, err := ReadReplay(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 3 {
		t.Fatalf("%d entries", len(entries))
	}
	w, err := NewWorkload(WorkloadConfig{Model: "served", Replay: entries, StreamFraction: 0, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	r0, r1, r2, r3 := w.Request(0), w.Request(1), w.Request(2), w.Request(3)
	if !r0.Stream || r0.Path != "/chat/completions" || !bytes.Contains(r0.Body, []byte(`"model":"served"`)) || !bytes.Contains(r0.Body, []byte(`"include_usage":true`)) {
		t.Errorf("line 1 replayed as %s %s stream=%v", r0.Path, r0.Body, r0.Stream)
	}
	if r1.Stream || r1.Path != "/completions" || bytes.Contains(r1.Body, []byte(`"stream"`)) {
		t.Errorf("line 2 replayed as %s %s", r1.Path, r1.Body)
	}
	if r2.PromptTokens != 100 || r2.MaxTokens != 20 || r2.Stream {
		t.Errorf("line 3 replayed as %+v", r2)
	}
	if !bytes.Equal(r3.Body, r0.Body) {
		t.Error("the replay does not start over after its last line")
	}
	for _, bad := range []string{"", "{}", "not json", `{"prompt_tokens":0,"output_tokens":5}`} {
		if _, err := ReadReplay(strings.NewReader(bad)); err == nil {
			t.Errorf("replay %q accepted", bad)
		}
	}
}
