package batch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
)

// The batch executor. The database is the only state that matters: a batch's
// status and one batch_lines row per finished line. The executor re-reads
// both whenever it (re)starts a batch, so a gateway restart resumes every
// unfinished batch and runs only the lines without a row. Handlers talk to
// it only through the store (a cancel is a status change it polls for).
//
// Each line runs through the [Generator] as the key that created the
// batch, so it is admitted, routed, hedged and metered — one ledger row —
// exactly like a request to the public API.
//
// The owner's key is re-read every PollInterval. Once it is revoked no new
// line starts: the lines not yet run are recorded as failed with the code
// api_key_revoked and the batch completes, so its owner still gets every
// answer already paid for.

// Stop causes of a batch's run.
var (
	errRunCancelled = errors.New("batch cancelled")
	errRunExpired   = errors.New("batch expired")
	errRunRevoked   = errors.New("owner key revoked")
	// errRunLost: another gateway took the batch over (this one's lease
	// ran out while it was cut off from the database).
	errRunLost = errors.New("batch taken over by another gateway")
)

// maxUpstreamRetries bounds the retries of a line that failed upstream.
const maxUpstreamRetries = 2

// Run runs batches until ctx is done: it picks up every batch that is
// validating, in progress, finalizing or cancelling (so after a restart the
// unfinished ones resume), validates input files, runs lines with bounded
// concurrency, and writes the output and error files. A batch created
// through the API starts at once (the handler wakes the executor); the
// PollInterval tick is the fallback, and every PollInterval it removes the files that have expired; at start it removes what a crash
// left in the files directory. When ctx is done it
// starts no new line, waits up to Config.DrainTimeout for the lines in
// flight, cancels the rest (they are not recorded and run again after a
// restart) and returns nil. With the Batch API off it returns at once.
// Call it at most once per Batches. Gateways sharing a database each run
// the batches they claimed (see data.Store.ClaimBatch): one gateway per
// batch, another taking over once the first's lease has run out; on a
// clean stop it gives its claims up.
func (s *Batches) Run(ctx context.Context) error {
	cfg := s.cfg
	if cfg.FilesDir == "" {
		return nil
	}
	if err := os.MkdirAll(cfg.FilesDir, 0o700); err != nil {
		return fmt.Errorf("batches: %w", err)
	}
	lineCtx, cancelLines := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelLines()
	x := &batchExec{
		s: s, cfg: cfg, log: s.log, lineCtx: lineCtx, started: cfg.Now(),
		global: make(chan struct{}, cfg.Concurrency),
		lanes:  map[int64]*tenantLane{},
	}

	if err := x.sweepFiles(ctx); err != nil && ctx.Err() == nil {
		s.log.Warn("batches: sweep the files directory", "err", err)
	}

	running := map[string]bool{}
	backoff := map[string]time.Time{} // batches whose last run failed, and when to try again
	done := make(chan batchDone)
	var wg sync.WaitGroup
	tick := time.NewTicker(cfg.PollInterval)
	defer tick.Stop()
	for expire := true; ctx.Err() == nil; {
		if expire {
			x.expireFiles(ctx)
			expire = false
		}
		ids, err := s.store.UnfinishedBatches(ctx)
		if err != nil && ctx.Err() == nil {
			s.log.Warn("batches: list unfinished", "err", err)
		}
		for _, id := range ids {
			if running[id] || time.Now().Before(backoff[id]) {
				continue
			}
			running[id] = true
			wg.Add(1)
			go func() {
				defer wg.Done()
				done <- batchDone{id, x.runBatch(ctx, id)}
			}()
		}
		select {
		case <-ctx.Done():
		case d := <-done:
			x.ended(d, running, backoff)
		case <-s.wake:
		case <-tick.C:
			expire = true
		}
	}

	if cfg.DrainTimeout < 0 {
		cancelLines()
	} else {
		stop := time.AfterFunc(cfg.DrainTimeout, cancelLines)
		defer stop.Stop()
	}
	for len(running) > 0 {
		x.ended(<-done, running, backoff)
	}
	wg.Wait()
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer rcancel()
	if err := s.store.ReleaseBatches(rctx); err != nil {
		s.log.Warn("batches: give up this gateway's claims (others take its batches over once its lease runs out)", "err", err)
	}
	return nil
}

type batchDone struct {
	id  string
	err error
}

func (x *batchExec) ended(d batchDone, running map[string]bool, backoff map[string]time.Time) {
	delete(running, d.id)
	delete(backoff, d.id)
	if d.err != nil && !errors.Is(d.err, context.Canceled) {
		x.log.Error("batch run failed; will retry", "batch", d.id, "err", d.err)
		backoff[d.id] = time.Now().Add(10 * x.cfg.PollInterval)
	}
}

// batchExec is the state Run shares with the batches it runs.
type batchExec struct {
	s   *Batches
	cfg Config
	log *slog.Logger
	// lineCtx is the context of lines in flight: it outlives Run's
	// context by the drain timeout.
	lineCtx context.Context
	global  chan struct{}
	started time.Time // when Run started: workers may still be registering

	mu    sync.Mutex
	lanes map[int64]*tenantLane
}

// tenantLane bounds a tenant's lines in flight and holds them back while
// the tenant is rate limited.
type tenantLane struct {
	slots chan struct{}

	mu        sync.Mutex
	notBefore time.Time
}

func (x *batchExec) lane(tenantID int64) *tenantLane {
	x.mu.Lock()
	defer x.mu.Unlock()
	l := x.lanes[tenantID]
	if l == nil {
		l = &tenantLane{slots: make(chan struct{}, x.cfg.TenantConcurrency)}
		x.lanes[tenantID] = l
	}
	return l
}

// pause holds the tenant's lines back for d.
func (l *tenantLane) pause(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := time.Now().Add(d); t.After(l.notBefore) {
		l.notBefore = t
	}
}

// wait returns once the tenant is not paused, false if ctx ends first.
func (l *tenantLane) wait(ctx context.Context) bool {
	for {
		l.mu.Lock()
		d := time.Until(l.notBefore)
		l.mu.Unlock()
		if d <= 0 {
			return true
		}
		if !sleep(ctx, d) {
			return false
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func acquire(ctx context.Context, sem chan struct{}) bool {
	if sem == nil {
		return true
	}
	select {
	case sem <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func release(sem chan struct{}) {
	if sem != nil {
		<-sem
	}
}

// runBatch takes batch id as far as it can: validate, run the lines it has
// no result for, finalize. It returns nil when the batch is finished or ctx
// ended the run.
func (x *batchExec) runBatch(ctx context.Context, id string) error {
	if ok, err := x.s.store.ClaimBatch(ctx, id); err != nil || !ok {
		return err // !ok: another gateway runs it
	}
	b, err := x.s.store.BatchByID(ctx, 0, id)
	if err != nil {
		return err
	}
	switch b.Status {
	case data.BatchFinalizing:
		return x.finalize(ctx, b, data.BatchFinalizing, data.BatchCompleted)
	case data.BatchCancelling:
		return x.finalize(ctx, b, data.BatchCancelling, data.BatchCancelled)
	case data.BatchValidating, data.BatchInProgress:
	default:
		return nil
	}
	f, err := os.Open(x.s.filePath(b.InputFileID))
	if errors.Is(err, os.ErrNotExist) && b.Status == data.BatchValidating {
		x.log.Error("batch failed: its input file is gone from the files directory", "batch", b.ID, "file", b.InputFileID)
		return x.s.store.FailBatch(ctx, b.ID, []data.BatchError{{Code: "input_file_missing",
			Message: "the input file's contents are missing on the gateway"}})
	}
	if err != nil {
		return fmt.Errorf("open input file: %w", err)
	}
	defer f.Close()
	// Validation applies the limits to a file stored under looser ones (an
	// older gateway, a lowered setting): its batch fails rather than hold
	// the whole file. A batch past validation passed them once and runs on
	// whatever they are now.
	maxLines, maxLineBytes := x.cfg.MaxFileLines, x.cfg.MaxLineBytes
	if b.Status != data.BatchValidating {
		maxLines, maxLineBytes = math.MaxInt, math.MaxInt64-1
	}
	lines, err := scanBatchInput(f, b.Endpoint, maxLines, maxLineBytes)
	var le *lineLimitError
	if errors.As(err, &le) {
		x.log.Warn("batch failed: its input file breaks a limit", "batch", b.ID, "file", b.InputFileID, "err", err)
		err := x.s.store.FailBatch(ctx, b.ID, []data.BatchError{{Code: le.Code, Message: le.Message, Line: le.Line}})
		if errors.Is(err, data.ErrBatchStatus) {
			return nil // cancelled meanwhile: the next poll finalizes it
		}
		return err
	}
	if err != nil {
		return fmt.Errorf("read input file: %w", err)
	}
	if b.Status == data.BatchValidating {
		if ok, err := x.validate(ctx, b, lines); !ok || err != nil {
			return err
		}
	}
	doneLines, err := x.s.store.BatchLinesDone(ctx, id)
	if err != nil {
		return err
	}
	starts, err := x.s.store.BatchLineStarts(ctx, id)
	if err != nil {
		return err
	}
	var pending, crashed []inputLine
	for _, l := range lines {
		switch {
		case l.errCode != "" || doneLines[l.n]:
		case starts[l.n] >= maxUncleanStarts:
			crashed = append(crashed, l)
		default:
			pending = append(pending, l)
		}
	}
	if len(crashed) > 0 {
		// A line that was running when the gateway died, twice, may be what
		// kills it: it fails alone instead of taking every restart down.
		x.log.Warn("batch lines failed: they were running during unclean stops of the gateway", "batch", b.ID,
			"lines", len(crashed), "starts", maxUncleanStarts)
		if err := x.failUnrun(ctx, b, crashed, "line_interrupted",
			fmt.Sprintf("this request was running during %d unclean stops of the gateway and is not run again", maxUncleanStarts)); err != nil {
			return err
		}
	}
	cause := x.runLines(ctx, b, f, pending, int64(len(doneLines)), int64(len(lines)))
	if ctx.Err() != nil {
		return nil
	}
	switch cause {
	case errRunLost:
		x.log.Warn("batch taken over by another gateway: this one was cut off from the database for longer than its lease", "batch", b.ID)
		return nil
	case errRunCancelled:
		return x.finalize(ctx, b, data.BatchCancelling, data.BatchCancelled)
	case errRunExpired, errRunRevoked:
		code, msg := "batch_expired", "this request could not be executed before the completion window expired"
		if cause == errRunRevoked {
			code, msg = "api_key_revoked", "the API key that created this batch was revoked before this request ran"
		}
		if err := x.failUnrun(ctx, b, pending, code, msg); err != nil {
			if errors.Is(err, data.ErrBatchStatus) {
				return nil // cancelled meanwhile: the next poll finalizes it
			}
			return err
		}
		if cause == errRunExpired {
			return x.finalize(ctx, b, data.BatchInProgress, data.BatchExpired)
		}
	case nil:
		// Every line ran, but a result that could not be stored leaves its
		// line to run again: finish only when every line has one.
		doneLines, err := x.s.store.BatchLinesDone(ctx, id)
		if err != nil {
			return err
		}
		if missing := len(lines) - len(doneLines); missing > 0 {
			return fmt.Errorf("%d lines have no stored result", missing)
		}
	default:
		return cause
	}
	if err := x.s.store.SetBatchStatus(ctx, id, []string{data.BatchInProgress}, data.BatchFinalizing); err != nil {
		if errors.Is(err, data.ErrBatchStatus) {
			return nil // cancelled while the last lines ran: the next poll finalizes it
		}
		return err
	}
	return x.finalize(ctx, b, data.BatchFinalizing, data.BatchCompleted)
}

// validate records the lines that cannot run and moves the batch to
// in_progress, or to failed when no line can run. ok is false when the
// batch is not to be run now.
func (x *batchExec) validate(ctx context.Context, b data.Batch, lines []inputLine) (ok bool, err error) {
	var invalid []data.BatchLine
	var errs []data.BatchError
	for _, l := range lines {
		if l.errCode == "" {
			continue
		}
		invalid = append(invalid, data.BatchLine{Line: l.n, ID: newID("batch_req_"), CustomID: l.customID,
			ErrorCode: l.errCode, ErrorMsg: l.errMsg})
		if len(errs) < 100 {
			errs = append(errs, data.BatchError{Code: l.errCode, Message: l.errMsg, Line: l.n + 1})
		}
	}
	if len(invalid) == len(lines) {
		if len(lines) == 0 {
			errs = []data.BatchError{{Code: "empty_file", Message: "the input file has no requests"}}
		}
		if err := x.s.store.FailBatch(ctx, b.ID, errs); err != nil && !errors.Is(err, data.ErrBatchStatus) {
			return false, err
		}
		x.log.Warn("batch failed validation: no line can run", "batch", b.ID, "lines", len(lines))
		return false, nil
	}
	if err := x.s.store.StartBatch(ctx, b.ID, int64(len(lines)), invalid); err != nil {
		if errors.Is(err, data.ErrBatchStatus) {
			return false, nil // cancelled while validating: the next poll finalizes it
		}
		return false, err
	}
	return true, nil
}

// runLines runs the pending lines of batch b until they are all done or
// the run stops (ctx ends, the batch is cancelled or expires, its key is
// revoked); it returns the stop cause, nil when every line was started. It
// returns once the lines it started have finished.
func (x *batchExec) runLines(ctx context.Context, b data.Batch, in io.ReaderAt, pending []inputLine, doneBefore, total int64) error {
	start := time.Now()
	x.log.Info("batch running", "batch", b.ID, "endpoint", b.Endpoint, "lines", total, "done", doneBefore, "to_run", len(pending))
	runCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)

	p, err := x.s.gate.PrincipalForKey(ctx, b.KeyID)
	switch {
	case errors.Is(err, policy.ErrInvalidKey):
		return errRunRevoked
	case err != nil:
		return err
	}
	var principal atomic.Pointer[policy.Principal]
	principal.Store(p)
	if !x.cfg.Now().Before(b.ExpiresAt) {
		return errRunExpired
	}

	var finished atomic.Int64
	var watchers sync.WaitGroup
	watchers.Go(func() {
		x.watch(runCtx, b, stop, &principal, func() {
			x.log.Info("batch progress", "batch", b.ID, "done", doneBefore+finished.Load(), "lines", total,
				"elapsed", time.Since(start).Round(time.Millisecond))
		})
	})
	defer watchers.Wait()
	defer stop(nil) // runs before watchers.Wait

	lane := x.lane(b.TenantID)
	var local chan struct{}
	if mc := p.MaxConcurrency; mc > 0 && mc < int64(x.cfg.TenantConcurrency) {
		local = make(chan struct{}, mc)
	}
	var lines sync.WaitGroup
	sems := []chan struct{}{local, lane.slots, x.global}
	for _, l := range pending {
		held := 0
		for _, sem := range sems {
			if !acquire(runCtx, sem) {
				break
			}
			held++
		}
		if held < len(sems) || !lane.wait(runCtx) {
			for _, sem := range sems[:held] {
				release(sem)
			}
			break
		}
		p := principal.Load()
		lines.Go(func() {
			defer func() {
				for _, sem := range sems {
					release(sem)
				}
			}()
			if x.runLine(runCtx, b, in, p, lane, l) {
				finished.Add(1)
			}
		})
	}
	lines.Wait()
	return context.Cause(runCtx)
}

// watch stops the run when the batch is cancelled, expires or its key is
// revoked, keeps the principal fresh (limits may change), and logs
// progress, until ctx ends.
func (x *batchExec) watch(ctx context.Context, b data.Batch, stop context.CancelCauseFunc,
	principal *atomic.Pointer[policy.Principal], progress func()) {
	poll := time.NewTicker(x.cfg.PollInterval)
	defer poll.Stop()
	prog := time.NewTicker(x.cfg.ProgressInterval)
	defer prog.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-prog.C:
			progress()
		case <-poll.C:
			if !x.cfg.Now().Before(b.ExpiresAt) {
				stop(errRunExpired)
				return
			}
			if cur, err := x.s.store.BatchByID(ctx, 0, b.ID); err == nil && cur.Status == data.BatchCancelling {
				stop(errRunCancelled)
				return
			}
			if ours, err := x.s.store.ClaimBatch(ctx, b.ID); err == nil && !ours {
				stop(errRunLost)
				return
			}
			p, err := x.s.gate.PrincipalForKey(ctx, b.KeyID)
			switch {
			case errors.Is(err, policy.ErrInvalidKey):
				x.log.Warn("batch stopped: its key was revoked", "batch", b.ID, "key", b.KeyID)
				stop(errRunRevoked)
				return
			case err == nil:
				principal.Store(p)
			}
		}
	}
}

// runLine runs one line to a result and records it; false means it has no
// result (the run stopped first, or the result could not be recorded), so
// it runs again if the batch does. Lines refused by a rate limit wait and
// retry for as long as the batch's window lasts (so do lines the admission
// queue refused); lines that failed upstream
// are retried a bounded number of times; every other answer is final.
func (x *batchExec) runLine(runCtx context.Context, b data.Batch, in io.ReaderAt, p *policy.Principal, lane *tenantLane, l inputLine) bool {
	raw := make([]byte, l.size)
	if _, err := in.ReadAt(raw, l.off); err != nil && !errors.Is(err, io.EOF) {
		x.log.Error("batch line: read input", "batch", b.ID, "line", l.n+1, "err", err)
		return false
	}
	body := []byte(gjson.GetBytes(raw, "body").Raw)
	// Noted before it runs, forgotten when it has a result or stops cleanly:
	// what is left after a crash counts towards maxUncleanStarts.
	before, err := x.s.store.StartBatchLine(runCtx, b.ID, l.n)
	if err != nil {
		x.log.Warn("batch line: note its start", "batch", b.ID, "line", l.n+1, "err", err)
	}
	// A line billed whose result was lost (its gateway died between the
	// two) is run again without billing it twice.
	line := Line{IDPrefix: fmt.Sprintf("req_%s_l%d_", b.ID, l.n), Group: b.ID}
	if before > 0 {
		billed, err := x.s.store.LineBilled(runCtx, b.TenantID, b.CreatedAt, line.IDPrefix)
		switch {
		case err != nil:
			x.log.Warn("batch line: look for an earlier billed run", "batch", b.ID, "line", l.n+1, "err", err)
		case billed:
			line.Prepaid = true
			x.log.Info("batch line: an earlier run was billed but its result was lost; running it again unbilled", "batch", b.ID, "line", l.n+1)
		}
	}
	for attempt := 0; ; attempt++ {
		res := x.s.gen.Generate(x.lineCtx, p, b.Endpoint, body, line)
		if res.Cancelled {
			x.endLine(b, l) // a clean stop: it runs again after a restart
			return false
		}
		var wait time.Duration
		switch {
		case waitsToRetry(res) && x.cfg.Now().Before(b.ExpiresAt):
			wait = res.RetryAfter
			if wait <= 0 {
				wait = time.Second
			}
			lane.pause(wait)
		case res.Status >= 500 && attempt < maxUpstreamRetries:
			wait = x.cfg.RetryWait << attempt
		case res.Code == "model_not_found" && b.CreatedAt.Before(x.started) && x.cfg.Now().Before(x.started.Add(registerGrace)):
			// A batch this gateway found when it started: the model's
			// workers may not have registered again yet (they do within
			// a heartbeat or two).
			wait = time.Second
		}
		if wait == 0 {
			return x.record(b, l, res)
		}
		if !sleep(runCtx, wait) || !lane.wait(runCtx) {
			x.endLine(b, l)
			return false
		}
	}
}

// waitsToRetry reports whether a line's answer is a refusal to wait out and
// retry: a rate limit, or the admission queue (full, or its wait ran out),
// where batch lines stand behind live traffic.
func waitsToRetry(res Answer) bool {
	switch res.Code {
	case "rate_limit_exceeded", "queue_full":
		return res.Status == http.StatusTooManyRequests
	case "queue_timeout":
		return res.Status == http.StatusRequestTimeout
	}
	return false
}

// registerGrace is how long after the executor starts a line of a batch
// created before it started, refused for a model no replica serves, waits
// and runs again: a gateway that restarts finds unfinished batches before
// its workers have registered again. (A new batch naming an unknown model
// fails at once.)
const registerGrace = 30 * time.Second

// maxUncleanStarts is how many runs of a line may end in a gateway crash
// before the line is failed instead of run again.
const maxUncleanStarts = 2

// endLine forgets that a line started, when it stops without a result on a
// clean stop.
func (x *batchExec) endLine(b data.Batch, l inputLine) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(x.lineCtx), 10*time.Second)
	defer cancel()
	if err := x.s.store.EndBatchLine(ctx, b.ID, l.n); err != nil {
		x.log.Warn("batch line: forget its start", "batch", b.ID, "line", l.n+1, "err", err)
	}
}

// record stores a line's answer; it returns whether it was stored.
func (x *batchExec) record(b data.Batch, l inputLine, res Answer) bool {
	bl := data.BatchLine{Line: l.n, ID: newID("batch_req_"), CustomID: l.customID, OK: res.Status == http.StatusOK,
		StatusCode: res.Status, RequestID: res.RequestID, Body: res.Body}
	if bl.OK {
		u := gjson.GetBytes(res.Body, "usage")
		bl.PromptTokens, bl.CompletionTokens = u.Get("prompt_tokens").Int(), u.Get("completion_tokens").Int()
	}
	// The answer is in hand (and billed): store it even while shutting down.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(x.lineCtx), 30*time.Second)
	defer cancel()
	if _, err := x.s.store.RecordBatchLines(ctx, b.ID, bl); err != nil {
		x.log.Error("batch line: record result", "batch", b.ID, "line", l.n+1, "request_id", res.RequestID, "err", err)
		return false
	}
	return true
}

// failUnrun records every pending line that has no result yet as failed
// with code.
func (x *batchExec) failUnrun(ctx context.Context, b data.Batch, pending []inputLine, code, msg string) error {
	done, err := x.s.store.BatchLinesDone(ctx, b.ID)
	if err != nil {
		return err
	}
	var ls []data.BatchLine
	for _, l := range pending {
		if !done[l.n] {
			ls = append(ls, data.BatchLine{Line: l.n, ID: newID("batch_req_"), CustomID: l.customID, ErrorCode: code, ErrorMsg: msg})
		}
	}
	_, err = x.s.store.RecordBatchLines(ctx, b.ID, ls...)
	return err
}

// finalize writes the batch's output and error files and moves it from
// status from to its final status to.
func (x *batchExec) finalize(ctx context.Context, b data.Batch, from, to string) error {
	out, errFile, err := x.writeResults(ctx, b)
	if err != nil {
		return err
	}
	if err := x.s.store.FinishBatch(ctx, b.ID, []string{from}, to, out, errFile); err != nil {
		for _, f := range []*data.File{out, errFile} {
			if f != nil {
				_ = os.Remove(x.s.filePath(f.ID))
			}
		}
		if errors.Is(err, data.ErrBatchStatus) {
			return nil // its status moved meanwhile (a cancel): the next poll takes it from there
		}
		return err
	}
	cur, err := x.s.store.BatchByID(ctx, 0, b.ID)
	if err != nil {
		return err
	}
	since := cur.InProgressAt
	if since.IsZero() {
		since = cur.CreatedAt
	}
	x.log.Info("batch finished", "batch", b.ID, "status", to, "lines", cur.Total, "completed", cur.Completed,
		"failed", cur.Failed, "took", time.Since(since).Round(time.Millisecond))
	return nil
}
