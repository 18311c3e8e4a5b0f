// Command streamgap measures what a hop adds to streamed chat completions:
// it holds K streams open at once against a direct URL (the engine) and a
// gateway URL, alternating between them, and compares the time to the first
// content chunk and the gaps between content chunks as the client sees them.
//
// With --target (repeated) it runs the at-once mode of
// scripts/bench-streams.sh instead: C streams opened in the same instant on
// each target, with the CPU and memory of each hop's processes (atonce.go).
//
// It is part of scripts/bench-overhead.sh; run against the simulated engine
// with a fixed --sim-tpot, so every gap the engine intends is the same and
// what the gateway adds stands out. Every stream and every round is bounded
// in time.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

func main() {
	var (
		direct   = flag.String("direct", "", "base URL of the engine, e.g. http://127.0.0.1:8000")
		gateway  = flag.String("gateway", "", "base URL of the gateway, e.g. http://127.0.0.1:8080")
		key      = flag.String("key", "", "API key sent to both (the engine ignores it)")
		model    = flag.String("model", "tailgate-sim", "model to ask for")
		streams  = flag.Int("streams", 200, "streams held open at once")
		tokens   = flag.Int("tokens", 100, "tokens per stream (max_tokens with ignore_eos)")
		duration = flag.Duration("duration", 10*time.Second, "how long each round starts new streams")
		ramp     = flag.Duration("ramp", 2*time.Second, "starts of the first streams are spread over this long (about one stream's length)")
		rounds   = flag.Int("rounds", 1, "rounds per target; targets alternate")
		timeout  = flag.Duration("stream-timeout", 2*time.Minute, "deadline of one stream")
		goalTTFT = flag.Duration("goal-ttft", 3*time.Millisecond, "goal: most added p50 time to first chunk")
		goalGap  = flag.Duration("goal-gap", 5*time.Millisecond, "goal: most extra inter-chunk gap")
		stall    = flag.Duration("stall", time.Second, "at-once mode: a gap between chunks over this is a stall")
		baseline = flag.String("baseline", "goproxy", "at-once mode: the target the others are compared with")
		jsonOut  = flag.String("json", "", "at-once mode: also write each target's figures to this file as JSON")
		targets  targetFlags
		keys     = keyFlags{}
	)
	flag.Var(keys, "target-key", "at-once mode, repeated: NAME=KEY, the key sent to that target instead of --key")
	flag.Var(&targets, "target", "at-once mode, repeated: NAME=URL[@PID[+PID...]] (a target named direct is the engine; PIDs are the hop's processes)")
	flag.Parse()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Stream to the benchmark."}],`+
		`"max_tokens":%d,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`, *model, *tokens)
	if len(targets) > 0 {
		if *streams < 1 || *tokens < 2 || *rounds < 1 {
			fmt.Fprintln(os.Stderr, "usage: streamgap --target NAME=URL[@PID] ... [--key KEY] [--streams C] [--tokens N] [--rounds R]")
			os.Exit(2)
		}
		for i, t := range targets {
			targets[i].key = *key
			if k, ok := keys[t.name]; ok {
				targets[i].key = k
			}
		}
		runAtOnce(targets, body, *streams, *tokens, *rounds, *stall, *timeout, *baseline, *jsonOut)
		return
	}
	if *direct == "" || *gateway == "" || *streams < 1 || *tokens < 2 || *rounds < 1 {
		fmt.Fprintln(os.Stderr, "usage: streamgap --direct URL --gateway URL [--key KEY] [--streams K] [--tokens N] [--duration D] [--rounds R]")
		os.Exit(2)
	}
	cfg := runConfig{key: *key, body: body, streams: *streams, duration: *duration, ramp: *ramp, timeout: *timeout}

	pair := []*target{{name: "direct", url: strings.TrimSuffix(*direct, "/")}, {name: "gateway", url: strings.TrimSuffix(*gateway, "/")}}
	for r := range *rounds {
		for _, t := range pair {
			t.client = newClient(*streams)
			start := time.Now()
			res := cfg.run(t)
			t.client.CloseIdleConnections()
			t.add(res)
			fmt.Fprintf(os.Stderr, "streamgap: round %d %-7s %d streams measured, %d failed, %s\n",
				r+1, t.name, len(res.ttft), res.failed, time.Since(start).Round(time.Millisecond))
		}
	}
	d, g := pair[0], pair[1]
	if len(d.ttft) == 0 || len(g.ttft) == 0 {
		fmt.Fprintln(os.Stderr, "streamgap: no stream completed on one of the targets")
		for _, t := range pair {
			for _, e := range t.errs {
				fmt.Fprintf(os.Stderr, "  %s: %s\n", t.name, e)
			}
		}
		os.Exit(1)
	}

	fmt.Printf("streams: %d concurrent, %d tokens each, %d round(s) of %s per path\n", *streams, *tokens, *rounds, *duration)
	fmt.Printf("%-22s %12s %12s %12s\n", "", "direct", "gateway", "added")
	row := func(name string, dv, gv time.Duration) {
		fmt.Printf("%-22s %12s %12s %12s\n", name, ms(dv), ms(gv), ms(gv-dv))
	}
	slices.Sort(d.ttft)
	slices.Sort(g.ttft)
	slices.Sort(d.gaps)
	slices.Sort(g.gaps)
	row("first chunk p50", pct(d.ttft, 0.50), pct(g.ttft, 0.50))
	row("first chunk p99", pct(d.ttft, 0.99), pct(g.ttft, 0.99))
	row("inter-chunk gap p50", pct(d.gaps, 0.50), pct(g.gaps, 0.50))
	row("inter-chunk gap p99", pct(d.gaps, 0.99), pct(g.gaps, 0.99))
	row("inter-chunk gap p99.9", pct(d.gaps, 0.999), pct(g.gaps, 0.999))
	row("inter-chunk gap max", d.gaps[len(d.gaps)-1], g.gaps[len(g.gaps)-1])
	fmt.Printf("%-22s %12d %12d\n", "streams measured", len(d.ttft), len(g.ttft))
	fmt.Printf("%-22s %12d %12d\n", "gaps measured", len(d.gaps), len(g.gaps))
	fmt.Printf("%-22s %12d %12d\n", "streams failed", d.failed, g.failed)
	for _, t := range pair {
		for _, e := range t.errs {
			fmt.Printf("  %s error: %s\n", t.name, e)
		}
	}

	addedTTFT := pct(g.ttft, 0.50) - pct(d.ttft, 0.50)
	extraMax := g.gaps[len(g.gaps)-1] - d.gaps[len(d.gaps)-1]
	extraP99 := pct(g.gaps, 0.99) - pct(d.gaps, 0.99)
	fmt.Printf("added time to first chunk p50: %s (goal <= %s): %s\n", ms(addedTTFT), ms(*goalTTFT), verdict(addedTTFT <= *goalTTFT))
	fmt.Printf("largest extra inter-chunk gap: max %s, p99 %s (goal <= %s): %s\n",
		ms(extraMax), ms(extraP99), ms(*goalGap), verdict(extraMax <= *goalGap && d.failed+g.failed == 0))
}

type runConfig struct {
	key      string
	body     string
	streams  int
	duration time.Duration
	ramp     time.Duration
	timeout  time.Duration
}

// target is one path under test and what was measured on it so far.
type target struct {
	name, url string
	client    *http.Client

	ttft   []time.Duration
	gaps   []time.Duration
	failed int
	errs   []string // a few distinct errors
}

func (t *target) add(r result) {
	t.ttft = append(t.ttft, r.ttft...)
	t.gaps = append(t.gaps, r.gaps...)
	t.failed += r.failed
	for _, e := range r.errs {
		if len(t.errs) < 5 && !slices.Contains(t.errs, e) {
			t.errs = append(t.errs, e)
		}
	}
}

type result struct {
	ttft   []time.Duration
	gaps   []time.Duration
	failed int
	errs   []string
}

func newClient(streams int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns: streams * 2, MaxIdleConnsPerHost: streams * 2, DisableCompression: true,
		ResponseHeaderTimeout: 30 * time.Second,
	}}
}

// run holds c.streams streams open against t for c.duration: worker i starts
// after i/streams of the ramp, then starts a new stream whenever its last one
// ends. A worker's first stream, which also opened its connection, is not
// measured.
func (c runConfig) run(t *target) result {
	var (
		mu  sync.Mutex
		res result
		wg  sync.WaitGroup
	)
	end := time.Now().Add(c.duration)
	for i := range c.streams {
		wg.Go(func() {
			time.Sleep(c.ramp * time.Duration(i) / time.Duration(c.streams))
			for n := 0; time.Now().Before(end); n++ {
				ttft, gaps, err := c.stream(t)
				mu.Lock()
				switch {
				case err != nil:
					res.failed++
					if len(res.errs) < 5 {
						res.errs = append(res.errs, err.Error())
					}
				case n > 0:
					res.ttft = append(res.ttft, ttft)
					res.gaps = append(res.gaps, gaps...)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return res
}

var (
	dataPrefix   = []byte("data: ")
	contentKey   = []byte(`"content":"`)
	emptyContent = []byte(`"content":""`)
	doneLine     = []byte("data: [DONE]")
)

// stream runs one streamed request and returns the time from sending it to
// the first content chunk and the gaps between content chunks.
func (c runConfig) stream(t *target) (ttft time.Duration, gaps []time.Duration, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url+"/v1/chat/completions", strings.NewReader(c.body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	start := time.Now()
	resp, err := t.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, nil, fmt.Errorf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	br := bufio.NewReaderSize(resp.Body, 16<<10)
	var last time.Time
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("stream ended before [DONE]")
			}
			return 0, nil, err
		}
		if !bytes.HasPrefix(line, dataPrefix) {
			continue
		}
		if bytes.HasPrefix(line, doneLine) {
			break
		}
		if !bytes.Contains(line, contentKey) || bytes.Contains(line, emptyContent) {
			continue
		}
		now := time.Now()
		if last.IsZero() {
			ttft = now.Sub(start)
		} else {
			gaps = append(gaps, now.Sub(last))
		}
		last = now
	}
	if last.IsZero() {
		return 0, nil, errors.New("stream carried no content")
	}
	return ttft, gaps, nil
}

// pct returns the q-quantile of sorted (nearest rank).
func pct(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond)) }

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}
