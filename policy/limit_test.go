package policy

import (
	"errors"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
)

// limitedGate returns a gate with an injected clock and a principal for a
// fresh key with the given options.
func limitedGate(t *testing.T, o KeyOptions) (*Gate, *Principal, *clock) {
	t.Helper()
	clk := newClock()
	st, _ := openStore(t)
	g := newGate(t, st, Config{Now: clk.Now})
	if o.Tenant == "" {
		o.Tenant = "acme"
	}
	secret, _ := createKey(t, st, o)
	return g, authenticate(t, g, secret), clk
}

func wantLimit(t *testing.T, err error, limit string) *LimitError {
	t.Helper()
	var le *LimitError
	if !errors.As(err, &le) || le.Limit != limit {
		t.Fatalf("err = %v, want %s limit", err, limit)
	}
	return le
}

func TestRPMBucket(t *testing.T) {
	g, p, clk := limitedGate(t, KeyOptions{RPM: 3})
	for i := range 3 {
		tk, rs, err := g.Admit(p, Request{Model: "m"})
		if err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		if rs.LimitRequests != 3 || rs.RemainingRequests != int64(2-i) || rs.LimitTokens != 0 {
			t.Fatalf("request %d: rate state %+v", i+1, rs)
		}
		tk.Release()
	}
	_, rs, err := g.Admit(p, Request{Model: "m"})
	if le := wantLimit(t, err, "requests"); le.RetryAfter != 20*time.Second {
		t.Fatalf("RetryAfter = %v, want 20s (one request per 20s)", le.RetryAfter)
	}
	if rs.RemainingRequests != 0 || rs.ResetRequests != time.Minute {
		t.Fatalf("rejected rate state %+v", rs)
	}

	clk.Advance(20*time.Second - time.Microsecond)
	_, _, err = g.Admit(p, Request{Model: "m"})
	if le := wantLimit(t, err, "requests"); le.RetryAfter != time.Microsecond {
		t.Fatalf("RetryAfter = %v, want 1µs", le.RetryAfter)
	}
	clk.Advance(time.Microsecond)
	tk, rs, err := g.Admit(p, Request{Model: "m"})
	if err != nil {
		t.Fatalf("after refill: %v", err)
	}
	tk.Release()
	if rs.RemainingRequests != 0 {
		t.Fatalf("remaining %d after refill, want 0", rs.RemainingRequests)
	}

	// An idle key refills to its capacity and no further.
	clk.Advance(time.Hour)
	for range 3 {
		tk, _, err := g.Admit(p, Request{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		tk.Release()
	}
	_, _, err = g.Admit(p, Request{Model: "m"})
	wantLimit(t, err, "requests")
}

func TestTPMReconciliation(t *testing.T) {
	g, p, clk := limitedGate(t, KeyOptions{TPM: 1200})
	r := Request{Model: "m", PromptEstimate: 100, PromptBound: 150, MaxTokens: 500}

	tk, rs, err := g.Admit(p, r)
	if err != nil {
		t.Fatal(err)
	}
	if rs.LimitTokens != 1200 || rs.RemainingTokens != 600 {
		t.Fatalf("after admission: %+v, want 600 of 1200 left", rs)
	}
	// Actual usage is 150: the 450 not used come back.
	tk.Settle(Usage{PromptTokens: 100, CompletionTokens: 50})
	_, rs, _ = g.Admit(p, Request{Model: "m", PromptEstimate: 2000}) // too big: rejected, shows state
	if rs.RemainingTokens != 1050 {
		t.Fatalf("after settling: %d tokens left, want 1050", rs.RemainingTokens)
	}

	// 1100 does not fit in 1050: 50 tokens at 20/s is 2.5s.
	_, _, err = g.Admit(p, Request{Model: "m", PromptEstimate: 600, MaxTokens: 500})
	if le := wantLimit(t, err, "tokens"); le.RetryAfter != 2500*time.Millisecond {
		t.Fatalf("RetryAfter = %v, want 2.5s", le.RetryAfter)
	}

	// Usage beyond the estimate is debt, repaid by refilling.
	tk, _, err = g.Admit(p, Request{Model: "m", PromptEstimate: 50, MaxTokens: 50})
	if err != nil {
		t.Fatal(err)
	}
	tk.Settle(Usage{PromptTokens: 1000, CompletionTokens: 1000}) // 1050 - 2000 = -950
	_, rs, err = g.Admit(p, Request{Model: "m", PromptEstimate: 1})
	if le := wantLimit(t, err, "tokens"); le.RetryAfter != 47550*time.Millisecond {
		t.Fatalf("RetryAfter = %v, want 47.55s (951 tokens at 20/s)", le.RetryAfter)
	}
	if rs.RemainingTokens != 0 || rs.ResetTokens != 107500*time.Millisecond {
		t.Fatalf("in debt: %+v", rs)
	}
	clk.Advance(47550 * time.Millisecond)
	tk, _, err = g.Admit(p, Request{Model: "m", PromptEstimate: 1})
	if err != nil {
		t.Fatalf("after repaying: %v", err)
	}
	tk.Release()
}

func TestTPMRequestLargerThanBucket(t *testing.T) {
	// A request larger than the whole bucket runs when the bucket is full,
	// leaving it in debt, rather than never.
	g, p, clk := limitedGate(t, KeyOptions{TPM: 100})
	tk, _, err := g.Admit(p, Request{Model: "m", PromptEstimate: 150, MaxTokens: 50})
	if err != nil {
		t.Fatal(err)
	}
	tk.Settle(Usage{PromptTokens: 150, CompletionTokens: 50})
	_, _, err = g.Admit(p, Request{Model: "m", PromptEstimate: 150})
	if le := wantLimit(t, err, "tokens"); le.RetryAfter != 2*time.Minute {
		t.Fatalf("RetryAfter = %v, want 2m (from -100 to a full 100)", le.RetryAfter)
	}
	clk.Advance(2 * time.Minute)
	if tk, _, err := g.Admit(p, Request{Model: "m", PromptEstimate: 150}); err != nil {
		t.Fatal(err)
	} else {
		tk.Release()
	}
}

func TestConcurrencyLimitReleasedOnEveryPath(t *testing.T) {
	g, p, _ := limitedGate(t, KeyOptions{MaxConcurrency: 2, BudgetTokens: ptr(1000)})
	r := Request{Model: "m", PromptBound: 10, MaxTokens: 10}
	admit := func() *Ticket {
		t.Helper()
		tk, _, err := g.Admit(p, r)
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	t1, t2 := admit(), admit()
	_, _, err := g.Admit(p, r)
	if le := wantLimit(t, err, "concurrency"); le.RetryAfter != 0 {
		t.Fatalf("RetryAfter = %v for concurrency", le.RetryAfter)
	}

	// Settling twice frees one slot, not two.
	t1.Settle(Usage{PromptTokens: 5, CompletionTokens: 5})
	t1.Settle(Usage{PromptTokens: 5, CompletionTokens: 5})
	t1.Release()
	t3 := admit()
	_, _, err = g.Admit(p, r)
	wantLimit(t, err, "concurrency")

	// Rejections by the budget or the model take no slot.
	t2.Release()
	t3.Release()
	for range 5 {
		if _, _, err := g.Admit(p, Request{Model: "m", PromptBound: 2000}); err == nil {
			t.Fatal("over-budget request admitted")
		}
	}
	t4, t5 := admit(), admit()
	t4.Release()
	t5.Settle(Usage{})
	spent, reserved := g.TenantState(p.TenantID)
	if spent.Tokens != 10 || reserved != (data.Spend{}) {
		t.Fatalf("spent %+v reserved %+v, want 10 tokens spent, nothing reserved", spent, reserved)
	}
	var nilTicket *Ticket
	if nilTicket.Settle(Usage{PromptTokens: 1}) != 0 {
		t.Fatal("nil ticket settled to a cost")
	}
}

func TestRejectionLeavesNoTrace(t *testing.T) {
	g, p, _ := limitedGate(t, KeyOptions{RPM: 2, TPM: 100, MaxConcurrency: 1, Models: []string{"m"}, BudgetTokens: ptr(50)})
	for _, r := range []Request{
		{Model: "other", PromptEstimate: 10},                             // model
		{Model: "m", PromptEstimate: 10, PromptBound: 60},                // budget
		{Model: "m", PromptEstimate: 10, PromptBound: 10, MaxTokens: 41}, // budget, just over
	} {
		if _, _, err := g.Admit(p, r); err == nil {
			t.Fatalf("%+v admitted", r)
		}
	}
	_, _, err := g.Admit(p, Request{Model: "other"})
	if !errors.Is(err, ErrModelNotAllowed) {
		t.Fatalf("err = %v, want ErrModelNotAllowed", err)
	}
	_, _, err = g.Admit(p, Request{Model: "m", PromptBound: 51})
	var qe *QuotaError
	if !errors.As(err, &qe) || qe.Tenant != "acme" || qe.Budget != "tokens" {
		t.Fatalf("err = %v, want tokens quota of acme", err)
	}
	// Nothing was taken: the full buckets, the slot and the budget remain.
	tk, rs, err := g.Admit(p, Request{Model: "m", PromptEstimate: 100, PromptBound: 10, MaxTokens: 40})
	if err != nil {
		t.Fatal(err)
	}
	if rs.RemainingRequests != 1 || rs.RemainingTokens != 0 {
		t.Fatalf("rate state %+v, want 1 request and 0 tokens left", rs)
	}
	if _, reserved := g.TenantState(p.TenantID); reserved.Tokens != 50 {
		t.Fatalf("reserved %d, want 50", reserved.Tokens)
	}
	tk.Release()
}

func TestBucketArithmetic(t *testing.T) {
	t0 := time.Unix(0, 0)
	var b bucket
	b.refill(t0, 7)
	if b.remaining() != 7 || b.reset(7) != 0 {
		t.Fatalf("new bucket: %d left, reset %v", b.remaining(), b.reset(7))
	}
	for range 7 {
		if ok, _ := b.check(1, 7); !ok {
			t.Fatal("full bucket refused")
		}
		b.take(1)
	}
	ok, wait := b.check(1, 7)
	// 60s/7 = 8.571428…s, rounded up to the microsecond.
	if ok || wait != 8571429*time.Microsecond {
		t.Fatalf("empty bucket: ok=%v wait=%v", ok, wait)
	}
	b.refill(t0.Add(wait), 7)
	if ok, _ := b.check(1, 7); !ok {
		t.Fatal("not refilled after the wait it announced")
	}

	// A clock step backwards refills nothing and does not break later refills.
	b.take(1)
	b.refill(t0, 7)
	if ok, _ := b.check(1, 7); ok {
		t.Fatal("backwards clock refilled")
	}

	// A lowered limit caps the level at once.
	var c bucket
	c.refill(t0, 100)
	c.refill(t0.Add(time.Second), 10)
	if c.remaining() != 10 {
		t.Fatalf("after lowering the limit: %d left, want 10", c.remaining())
	}
	// Huge limits and idle times neither overflow nor go negative.
	var d bucket
	d.refill(t0, 1<<62)
	d.take(1 << 62)
	d.take(1 << 62)
	d.refill(t0.Add(1000*time.Hour), 1<<62)
	if d.remaining() != maxLimit {
		t.Fatalf("huge bucket: %d left, want %d", d.remaining(), int64(maxLimit))
	}
}

func TestAdmitWithHandBuiltPrincipal(t *testing.T) {
	// A Principal not produced by Authenticate still shares its key's and
	// tenant's state.
	clk := newClock()
	st, _ := openStore(t)
	g := newGate(t, st, Config{Now: clk.Now})
	p1 := &Principal{KeyID: "key_x", TenantID: 99, Tenant: "x", RPM: 1}
	p2 := &Principal{KeyID: "key_x", TenantID: 99, Tenant: "x", RPM: 1}
	tk, _, err := g.Admit(p1, Request{Model: "m", PromptBound: 5, MaxTokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	if _, reserved := g.TenantState(99); reserved.Tokens != 10 {
		t.Fatalf("reserved %+v, want 10 tokens", reserved)
	}
	_, _, err = g.Admit(p2, Request{Model: "m"})
	wantLimit(t, err, "requests")
	if c := tk.Settle(Usage{PromptTokens: 3, CompletionTokens: 4}); c != 0 {
		t.Fatalf("free model cost %d", c)
	}
	if spent, reserved := g.TenantState(99); spent.Tokens != 7 || reserved.Tokens != 0 {
		t.Fatalf("spent %+v reserved %+v", spent, reserved)
	}
}
