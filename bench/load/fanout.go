package load

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"mime/multipart"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The fan-out workload: documents split into parts that are sent at once,
// a document done when its slowest part is (the design of the seed paper on
// asynchronous decomposition with hedging). It is measured three ways —
// monolithic (one request per document asking for the parts' whole
// output), decomposed, decomposed with hedging — each streamed, as JSON and
// through the Batch API (one batch per document).

// FanoutOptions configures `bench --scenario fanout` and `bench
// --sweep-hedge`; zero fields mean the defaults named.
type FanoutOptions struct {
	// Docs is the number of documents per arm; 0 means 300. A design's
	// P95 is decided by its few slowest documents: in a model of the
	// scenario the unhedged P95 of 100 documents falls within ±12 % of its
	// median in 90 % of runs, of 300 within ±7 % (README, "Fan-out").
	Docs int
	// MinParts and MaxParts bound a document's parts, drawn uniformly; 0
	// means 4 and 8.
	MinParts, MaxParts int
	// DocRate is the documents started per second (Poisson); 0 means 6.
	DocRate float64
	// Modes are the ways parts are sent: stream, json, batch; nil means
	// all three.
	Modes []string
	// Seeds are the seeds run one after another; nil means Options.Seed.
	Seeds []int64
	// Sweep runs the threshold procedure instead: decomposed, streamed
	// parts at each Percentile × Budget (see [Main]).
	Sweep       bool
	Percentiles []float64 // nil means 0.8, 0.9, 0.95, 0.99
	Budgets     []float64 // nil means 0.05, 0.10, 0.15
	// WarmParts are sent to each fresh gateway before anything is
	// measured, so its hedge delay is learnt; 0 means 240.
	WarmParts int
}

func (f FanoutOptions) withDefaults(seed int64) FanoutOptions {
	f.Docs = orDefault(f.Docs, 300)
	f.MinParts = orDefault(f.MinParts, 4)
	f.MaxParts = orDefault(f.MaxParts, 8)
	f.DocRate = orDefault(f.DocRate, 6)
	f.WarmParts = orDefault(f.WarmParts, warmParts)
	if len(f.Modes) == 0 {
		f.Modes = []string{"stream", "json", "batch"}
	}
	if len(f.Seeds) == 0 {
		f.Seeds = []int64{seed}
	}
	if len(f.Percentiles) == 0 {
		f.Percentiles = []float64{0.8, 0.9, 0.95, 0.99}
	}
	if len(f.Budgets) == 0 {
		f.Budgets = []float64{0.05, 0.10, 0.15}
	}
	return f
}

func (f FanoutOptions) validate() error {
	switch {
	case f.Docs < 1 || f.Docs > 100000:
		return fmt.Errorf("--docs %d: want 1 to 100000", f.Docs)
	case f.MinParts < 1 || f.MaxParts < f.MinParts || f.MaxParts > 64:
		return fmt.Errorf("--parts %d-%d: want MIN-MAX with 1 ≤ MIN ≤ MAX ≤ 64", f.MinParts, f.MaxParts)
	case !(f.DocRate > 0) || math.IsInf(f.DocRate, 0):
		return fmt.Errorf("--doc-rate %v: want documents per second above 0", f.DocRate)
	case f.WarmParts < 0 || f.WarmParts > 100000:
		return fmt.Errorf("--warm-parts %d: want 0 to 100000 (0: the default)", f.WarmParts)
	}
	for _, m := range f.Modes {
		if m != "stream" && m != "json" && m != "batch" {
			return fmt.Errorf("--modes: %q is not stream, json or batch", m)
		}
	}
	for _, p := range f.Percentiles {
		if !(p > 0 && p < 1) {
			return fmt.Errorf("--sweep-percentiles: %v is not in (0,1)", p)
		}
	}
	for _, b := range f.Budgets {
		if !(b > 0 && b <= 1) {
			return fmt.Errorf("--sweep-budgets: %v is not in (0,1]", b)
		}
	}
	return nil
}

// Fan-out sizes, scaled 1:15 from the seed paper's documents: a part asks
// for about 50 tokens (0.6 s at 12 ms a token), a document of 4–8 parts for
// 200–400, so a monolithic answer takes 3–5 s where the paper's took 60 s.
const (
	fanoutPromptMedian = 256
	fanoutOutputMedian = 50
	fanoutSpread       = 0.2
)

// doc is one document: its parts' bodies' contents and lengths.
type doc struct {
	id     string
	prompt []string // each part's text
	out    []int    // each part's max_tokens
}

// fanoutDocs draws n documents of seed; document i depends only on (seed, i).
func fanoutDocs(seed int64, n, minParts, maxParts int) []doc {
	docs := make([]doc, n)
	for i := range docs {
		r := rand.New(rand.NewPCG(uint64(seed), uint64(i)^0xfa40f))
		k := minParts + r.IntN(maxParts-minParts+1)
		d := doc{id: fmt.Sprintf("doc-%d-%d", seed, i)}
		for p := range k {
			pt := Dist{Kind: "lognormal", A: fanoutPromptMedian, B: fanoutSpread}.Draw(r)
			var text strings.Builder
			fmt.Fprintf(&text, "%s part %d:", d.id, p)
			for range max(pt-12, 1) {
				text.WriteByte(' ')
				text.WriteString(words[r.IntN(len(words))])
			}
			d.prompt = append(d.prompt, text.String())
			d.out = append(d.out, Dist{Kind: "lognormal", A: fanoutOutputMedian, B: fanoutSpread}.Draw(r))
		}
		docs[i] = d
	}
	return docs
}

// requests returns the document's bodies: one per part, or one for the
// whole document (its parts' prompts joined, their outputs summed).
func (d doc) requests(model string, monolithic, stream bool) [][]byte {
	body := func(text string, maxTokens int) []byte {
		m := map[string]any{"model": model, "max_tokens": maxTokens, "ignore_eos": true,
			"messages": []map[string]string{{"role": "user", "content": text}}}
		if stream {
			m["stream"] = true
		}
		b, _ := json.Marshal(m)
		return b
	}
	if monolithic {
		total := 0
		for _, o := range d.out {
			total += o
		}
		return [][]byte{body(strings.Join(d.prompt, "\n"), total)}
	}
	out := make([][]byte, len(d.prompt))
	for i, p := range d.prompt {
		out[i] = body(p, d.out[i])
	}
	return out
}

// fanoutClient sends documents to one gateway.
type fanoutClient struct {
	hc      *http.Client
	base    string // …/v1
	key     string
	model   string
	timeout time.Duration
}

// docResult is one document's outcome.
type docResult struct {
	ms  float64 // start to its last part's answer
	err string  // "" when every part answered
}

// runDoc sends d in mode and waits for its last part.
func (c *fanoutClient) runDoc(ctx context.Context, d doc, mode string, monolithic, noHedge bool) docResult {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	start := time.Now()
	bodies := d.requests(c.model, monolithic, mode == "stream")
	if mode == "batch" {
		if err := c.runBatch(ctx, bodies); err != nil {
			return docResult{err: err.Error()}
		}
		return docResult{ms: float64(time.Since(start)) / float64(time.Millisecond)}
	}
	errs := make([]error, len(bodies))
	var wg sync.WaitGroup
	for i, b := range bodies {
		wg.Go(func() { errs[i] = c.post(ctx, b, d.id, mode == "stream", noHedge) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return docResult{err: err.Error()}
	}
	return docResult{ms: float64(time.Since(start)) / float64(time.Millisecond)}
}

// post sends one part and reads its whole answer.
func (c *fanoutClient) post(ctx context.Context, body []byte, group string, stream, noHedge bool) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tailgate-Group", group)
	if noHedge {
		req.Header.Set("X-Tailgate-Hedge", "off")
	}
	c.auth(req)
	resp, err := c.hc.Do(req)
	if err != nil {
		return classifyFanout(ctx, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	switch {
	case err != nil:
		return classifyFanout(ctx, err)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("http_%d", resp.StatusCode)
	case stream && !bytes.Contains(b, []byte("data: [DONE]")):
		return errors.New(ErrStreamCut)
	case !stream && !bytes.Contains(b, []byte(`"choices"`)):
		return errors.New(ErrBadBody)
	}
	return nil
}

func classifyFanout(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return errors.New(ErrTimeout)
	}
	return fmt.Errorf("%s: %v", ErrTransport, err)
}

func (c *fanoutClient) auth(req *http.Request) {
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
}

// runBatch uploads bodies as a batch input file, creates the batch and
// polls it until it is done: the document's time through the Batch API.
func (c *fanoutClient) runBatch(ctx context.Context, bodies [][]byte) error {
	var file bytes.Buffer
	for i, b := range bodies {
		fmt.Fprintf(&file, `{"custom_id":"part-%d","method":"POST","url":"/v1/chat/completions","body":%s}`+"\n", i, b)
	}
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "parts.jsonl")
	_, _ = fw.Write(file.Bytes())
	_ = mw.Close()
	var f struct {
		ID string `json:"id"`
	}
	if err := c.call(ctx, http.MethodPost, "/files", mw.FormDataContentType(), &form, &f); err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	var b struct {
		ID            string `json:"id"`
		Status        string `json:"status"`
		RequestCounts struct {
			Completed, Failed int
		} `json:"request_counts"`
	}
	create := fmt.Sprintf(`{"input_file_id":%q,"endpoint":"/v1/chat/completions","completion_window":"24h"}`, f.ID)
	if err := c.call(ctx, http.MethodPost, "/batches", "application/json", strings.NewReader(create), &b); err != nil {
		return fmt.Errorf("create batch: %w", err)
	}
	for {
		switch b.Status {
		case "completed":
			if b.RequestCounts.Failed > 0 {
				return fmt.Errorf("batch_lines_failed")
			}
			return nil
		case "failed", "expired", "cancelled":
			return fmt.Errorf("batch_%s", b.Status)
		}
		select {
		case <-ctx.Done():
			return errors.New(ErrTimeout)
		case <-time.After(20 * time.Millisecond):
		}
		if err := c.call(ctx, http.MethodGet, "/batches/"+b.ID, "", nil, &b); err != nil {
			return fmt.Errorf("poll batch: %w", err)
		}
	}
}

func (c *fanoutClient) call(ctx context.Context, method, path, ctype string, body io.Reader, into any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	c.auth(req)
	resp, err := c.hc.Do(req)
	if err != nil {
		return classifyFanout(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("http_%d: %s", resp.StatusCode, bytes.TrimSpace(msg))
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(into)
}

// runArm sends docs at rate per second (seeded Poisson starts) in mode and
// returns each document's result, in document order. progress, when not
// nil, is told of each finished document.
func (c *fanoutClient) runArm(ctx context.Context, docs []doc, seed int64, rate float64, mode string, monolithic, noHedge bool, progress func()) []docResult {
	out := make([]docResult, len(docs))
	r := rand.New(rand.NewPCG(uint64(seed), 0xa771))
	start := time.Now()
	at := time.Duration(0)
	var wg sync.WaitGroup
	for i, d := range docs {
		if wait := time.Until(start.Add(at)); wait > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
		if ctx.Err() != nil {
			out[i] = docResult{err: ErrAborted}
			continue
		}
		wg.Go(func() {
			out[i] = c.runDoc(ctx, d, mode, monolithic, noHedge)
			if progress != nil {
				progress()
			}
		})
		at += time.Duration(r.ExpFloat64() / rate * float64(time.Second))
	}
	wg.Wait()
	return out
}

// warmParts is how many parts warm a gateway up before anything is
// measured: its hedge delay needs 50 samples to start and a few hundred for
// a steady high percentile of a tail that stalls 3 % of requests.
const warmParts = 240

// warm sends n parts, a few at a time, so the gateway's hedge delay has
// the samples it needs before anything is measured.
func (c *fanoutClient) warm(ctx context.Context, seed int64, n int) {
	docs := fanoutDocs(seed^0x3a3a, n/4+1, 4, 4)
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, d := range docs {
		for _, b := range d.requests(c.model, false, true) {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				_ = c.post(ctx, b, "", true, false)
			})
		}
	}
	wg.Wait()
}
