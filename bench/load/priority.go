package load

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// The priority workload: interactive requests (a key of class interactive,
// open loop) alone, then the same requests at the same times beside a
// Batch API job submitted when they start. Batch lines run as class batch,
// so under load they wait in the admission queue while interactive
// requests are admitted at once: interactive p99 should barely move.

// PriorityOptions configures `bench --scenario priority`; zero fields mean
// the defaults named.
type PriorityOptions struct {
	// Lines is the batch job's size; 0 means 2000.
	Lines int
	// Duration is how long interactive traffic runs in each phase; 0 means
	// 30s.
	Duration time.Duration
	// MaxRatio is the highest interactive p99 with the batch over p99
	// without it that passes; 0 means 1.2.
	MaxRatio float64
}

func (p PriorityOptions) withDefaults() PriorityOptions {
	p.Lines = orDefault(p.Lines, 2000)
	p.Duration = orDefault(p.Duration, 30*time.Second)
	p.MaxRatio = orDefault(p.MaxRatio, 1.2)
	return p
}

func (p PriorityOptions) validate(rate float64) error {
	switch {
	case p.Lines < 1 || p.Lines > 50000:
		return fmt.Errorf("--batch-lines %d: want 1 to 50000 (the Batch API's limit)", p.Lines)
	case p.Duration < time.Second || p.Duration > time.Hour:
		return fmt.Errorf("--priority-duration %v: want 1s to 1h", p.Duration)
	case !(p.MaxRatio >= 1):
		return fmt.Errorf("--max-ratio %v: want 1 or more (interactive p99 with the batch over p99 without)", p.MaxRatio)
	case !(rate > 0) || rate > 1000:
		return fmt.Errorf("--rate %v: want interactive requests per second, above 0 and at most 1000", rate)
	}
	return nil
}

// The priority fleet: 3 replicas of 8 slots, a batch line about 0.3 s (40
// ms to the first token, 64 tokens 4 ms apart), so the fleet runs about 60
// lines a second; a 2,000-line batch let run 256 lines at once keeps it
// full for about 35 s. The gateway's admission capacity is the fleet's
// slots, so it knows when it is full from the start, and its headroom (the
// slots batch lines leave to interactive requests) is sized for the
// interactive load: 20 requests a second of about 0.1 s are 2 in flight on
// average and at most 6 in 99.5 % of moments (Poisson); the default
// headroom, an eighth of 24 slots, is 3, and a fourth interactive request
// in flight would queue in an engine behind batch lines.
const (
	priorityReplicas = 3
	prioritySlots    = 8
	priorityOutput   = 64
	priorityHeadroom = 6
)

var prioritySimArgs = []string{"--sim-ttft", "40ms", "--sim-tpot", "4ms", "--sim-max-seqs", strconv.Itoa(prioritySlots)}

func priorityGatewayArgs(replicas int) []string {
	return []string{"--admit-capacity", strconv.Itoa(replicas * prioritySlots), "--admit-headroom", strconv.Itoa(priorityHeadroom),
		"--batch-concurrency", "256", "--batch-tenant-concurrency", "256"}
}

// priorityPhase is one phase's interactive latencies and, with a batch,
// how the batch went.
type priorityPhase struct {
	Name     string
	TTFT     Summary // ms, start to the first event
	Latency  Summary // ms, start to the whole answer
	Errors   map[string]int
	Waits    map[string]admissionWait // by class, over the phase
	Batch    string                   // "" without a batch, else its outcome
	BatchDur time.Duration
}

// admissionWait is a class's admission waits from the gateway's histogram.
type admissionWait struct {
	N      float64 // requests admitted
	AtOnce float64 // of which admitted without waiting
	Sum    float64 // seconds waited in all
}

// mainPriority runs `bench --scenario priority`.
func mainPriority(ctx context.Context, o Options) error {
	switch {
	case o.A.Target != "":
		return errors.New("--scenario priority starts its own fleet: give no --target")
	case o.Compare:
		return errors.New("--compare does not apply to the priority scenario: it compares its two phases by itself")
	}
	p := o.Priority.withDefaults()
	rate := orDefault(o.Rate, 20)
	if err := p.validate(rate); err != nil {
		return err
	}
	bin, err := (&bench{opts: o}).binary()
	if err != nil {
		return err
	}
	replicas := orDefault(o.Replicas, priorityReplicas)
	fleet, err := StartLocal(ctx, LocalConfig{
		Binary: bin, Keep: o.Keep, Replicas: replicas, Model: orDefault(o.A.Model, "tailgate-sim"),
		GatewayArgs:    append(priorityGatewayArgs(replicas), strings.Fields(o.A.GatewayArgs)...),
		WorkerArgs:     append(append([]string{}, prioritySimArgs...), strings.Fields(o.A.WorkerArgs)...),
		StartupTimeout: orDefault(o.StartupTimeout, time.Minute), Log: o.Stderr,
	})
	if err != nil {
		return err
	}
	defer fleet.Close()
	ikey, err := fleet.CreateKey(ctx, "interactive", "--class", "interactive")
	if err != nil {
		return err
	}
	t := fleet.Target()
	model := orDefault(o.A.Model, "tailgate-sim")
	timeout := orDefault(o.Timeout, 30*time.Second)
	hc := newHTTPClient(false, 0)
	inter := &fanoutClient{hc: hc, base: strings.TrimSuffix(t.BaseURL, "/"), key: ikey, model: model, timeout: timeout}
	batch := &fanoutClient{hc: hc, base: inter.base, key: t.Key, model: model, timeout: 10*p.Duration + 10*time.Minute}
	progress := orWriter(o.Progress)

	w := orWriter(o.Stdout)
	fmt.Fprintf(w, "priority: interactive requests (key class interactive) at %g/s for %v, alone and beside a %d-line Batch API job; %d replicas of %d slots, %d kept for interactive requests\n",
		rate, p.Duration, p.Lines, replicas, prioritySlots, priorityHeadroom)
	// Warm: the fleet's connections and the sims' first requests.
	inter.interactive(ctx, o.Seed^0x77, rate, time.Second, nil)

	var phases []priorityPhase
	for _, withBatch := range []bool{false, true} {
		ph := priorityPhase{Name: "interactive alone", Errors: map[string]int{}}
		if withBatch {
			ph.Name = fmt.Sprintf("with a %d-line batch", p.Lines)
		}
		before, _ := scrapeWaits(ctx, t.AdminURL, t.AdminToken)
		var (
			wg       sync.WaitGroup
			batchErr error
		)
		start := time.Now()
		if withBatch {
			wg.Go(func() {
				bctx, cancel := context.WithTimeout(ctx, batch.timeout)
				defer cancel()
				batchErr = batch.runBatch(bctx, priorityLines(model, p.Lines))
				ph.BatchDur = time.Since(start)
			})
		}
		fmt.Fprintf(progress, "bench: %s…\n", ph.Name)
		ttft, lat := inter.interactive(ctx, o.Seed, rate, p.Duration, ph.Errors)
		wg.Wait()
		ph.TTFT, ph.Latency = Summarize(ttft), Summarize(lat)
		if withBatch {
			ph.Batch = "completed"
			if batchErr != nil {
				ph.Batch = batchErr.Error()
			}
		}
		if after, err := scrapeWaits(ctx, t.AdminURL, t.AdminToken); err == nil {
			ph.Waits = map[string]admissionWait{}
			for c, a := range after {
				b := before[c]
				ph.Waits[c] = admissionWait{N: a.N - b.N, AtOnce: a.AtOnce - b.AtOnce, Sum: a.Sum - b.Sum}
			}
		}
		phases = append(phases, ph)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return writePriority(w, phases, p)
}

// writePriority prints the phases and the verdict: an error when the ratio
// of p99s is over p.MaxRatio, a phase had errors or the batch failed.
func writePriority(w io.Writer, phases []priorityPhase, p PriorityOptions) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\trequests\terrors\tttft p50\tp95\tp99\ttotal p50\tp95\tp99\tmax\t")
	for _, ph := range phases {
		errs := 0
		for _, n := range ph.Errors {
			errs += n
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t\n", ph.Name, ph.Latency.N, errs,
			ph.TTFT.P50, ph.TTFT.P95, ph.TTFT.P99, ph.Latency.P50, ph.Latency.P95, ph.Latency.P99, ph.Latency.Max)
	}
	_ = tw.Flush()
	var problems []string
	for _, ph := range phases {
		for class, n := range ph.Errors {
			problems = append(problems, fmt.Sprintf("%s: %d %s", ph.Name, n, class))
		}
		for _, c := range []string{"interactive", "batch"} {
			if wt, ok := ph.Waits[c]; ok && wt.N > 0 {
				fmt.Fprintf(w, "%s: %s: %.0f admitted, %.0f at once, %.0f waited in the admission queue (%.0f ms on average)\n",
					ph.Name, c, wt.N, wt.AtOnce, wt.N-wt.AtOnce, 1000*wt.Sum/wt.N)
			}
		}
		if ph.Batch != "" {
			fmt.Fprintf(w, "%s: batch %s in %.1f s\n", ph.Name, ph.Batch, ph.BatchDur.Seconds())
			if ph.Batch != "completed" {
				problems = append(problems, "the batch: "+ph.Batch)
			}
		}
	}
	alone, with := phases[0].Latency.P99, phases[len(phases)-1].Latency.P99
	if alone > 0 && with > 0 {
		ratio := with / alone
		verdict := "PASS"
		if ratio > p.MaxRatio {
			verdict = "FAIL"
			problems = append(problems, fmt.Sprintf("interactive p99 ×%.2f beside the batch, over --max-ratio %g", ratio, p.MaxRatio))
		}
		fmt.Fprintf(w, "interactive p99 with the batch / alone: %.0f / %.0f ms = %.2f (max %g): %s\n", with, alone, ratio, p.MaxRatio, verdict)
	}
	if len(problems) > 0 {
		return fmt.Errorf("priority: %s", strings.Join(problems, "; "))
	}
	return nil
}

// priorityLines is the batch job's requests.
func priorityLines(model string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, `{"model":%q,"max_tokens":%d,"ignore_eos":true,"messages":[{"role":"user","content":"batch line %d: summarise the quarterly report"}]}`,
			model, priorityOutput, i)
	}
	return out
}

// interactive sends streamed requests for d at rate per second (seeded
// Poisson arrivals, each its own prompt) and returns, in ms, the time to
// the first event and to the whole answer of those answered whole; errs,
// when not nil, counts the others by class.
func (c *fanoutClient) interactive(ctx context.Context, seed int64, rate float64, d time.Duration, errs map[string]int) (ttft, total []float64) {
	r := rand.New(rand.NewPCG(uint64(seed), 0x1a7e))
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	start := time.Now()
	for at, i := time.Duration(0), 0; at < d && ctx.Err() == nil; i++ {
		if wait := time.Until(start.Add(at)); wait > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
		body := fmt.Appendf(nil, `{"model":%q,"max_tokens":16,"ignore_eos":true,"stream":true,"messages":[{"role":"user","content":"interactive question %d of seed %d"}]}`,
			c.model, i, seed)
		wg.Go(func() {
			first, whole, err := c.stream(ctx, body)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if errs != nil {
					errs[errClass(err.Error())]++
				}
				return
			}
			ttft, total = append(ttft, first), append(total, whole)
		})
		at += time.Duration(r.ExpFloat64() / rate * float64(time.Second))
	}
	wg.Wait()
	return ttft, total
}

// stream sends one streamed request and returns the ms to its first event
// and to [DONE].
func (c *fanoutClient) stream(ctx context.Context, body []byte) (first, whole float64, err error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	ms := func(t0 time.Time) float64 { return float64(time.Since(t0)) / float64(time.Millisecond) }
	t0 := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	c.auth(req)
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, 0, classifyFanout(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return 0, 0, fmt.Errorf("http_%d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data: ")) {
			continue
		}
		if first == 0 {
			first = ms(t0)
		}
		if bytes.Equal(line, []byte("data: [DONE]")) {
			return first, ms(t0), nil
		}
	}
	if ctx.Err() != nil {
		return 0, 0, errors.New(ErrTimeout)
	}
	return 0, 0, errors.New(ErrStreamCut)
}

// scrapeWaits reads tailgate_admission_wait_seconds per class: how many
// were admitted, how many at once (the histogram's first bucket holds the
// zero waits), and the seconds waited.
func scrapeWaits(ctx context.Context, adminURL, token string) (map[string]admissionWait, error) {
	out := map[string]admissionWait{}
	firstBucket := map[string]bool{}
	err := eachSample(ctx, adminURL, token, func(name, labels string, v float64) {
		if !strings.HasPrefix(name, "tailgate_admission_wait_seconds") {
			return
		}
		class := labelValue(labels, "class")
		a := out[class]
		switch name {
		case "tailgate_admission_wait_seconds_count":
			a.N = v
		case "tailgate_admission_wait_seconds_sum":
			a.Sum = v
		case "tailgate_admission_wait_seconds_bucket":
			if !firstBucket[class] { // buckets come in order, smallest first
				firstBucket[class] = true
				a.AtOnce = v
			}
		}
		out[class] = a
	})
	return out, err
}

// labelValue returns a label's value in a Prometheus label list.
func labelValue(labels, name string) string {
	_, v, ok := strings.Cut(labels, name+`="`)
	if !ok {
		return ""
	}
	v, _, _ = strings.Cut(v, `"`)
	return v
}
