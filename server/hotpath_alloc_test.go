package server

import (
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
)

// TestLiveCallListCostsNoAllocation: every request is listed for the
// dashboard while it runs; listing it costs a slot another request gave
// back, not an allocation nor a copy of what the dashboard shows (that is
// built when the dashboard asks).
func TestLiveCallListCostsNoAllocation(t *testing.T) {
	l := newLiveCalls()
	cl := &call{id: "req_1", start: time.Now(), ep: chatEndpoint,
		principal: &policy.Principal{Tenant: "acme", KeyID: "key_1", KeyPrefix: "sk-tg-ab"}}
	other := &call{id: "req_2", start: cl.start.Add(time.Millisecond), ep: chatEndpoint}
	slot := l.track(cl)
	l.untrack(l.track(other))
	otherSlot := l.track(other)
	got := l.list()
	if len(got) != 2 || got[0] != (LiveCall{ID: "req_1", Start: cl.start, Endpoint: "/v1/chat/completions",
		Tenant: "acme", KeyID: "key_1", KeyPrefix: "sk-tg-ab"}) || got[1].ID != "req_2" {
		t.Fatalf("listed %+v", got)
	}
	l.untrack(slot)
	if got := l.list(); len(got) != 1 || got[0].ID != "req_2" {
		t.Fatalf("listed %+v after req_1 ended", got)
	}
	l.untrack(otherSlot)
	if got := l.list(); len(got) != 0 {
		t.Fatalf("listed %+v after the requests ended", got)
	}
	if n := testing.AllocsPerRun(100, func() { l.untrack(l.track(cl)) }); n != 0 {
		t.Errorf("listing a request allocates %.0f times, want 0", n)
	}
}

// TestTimingCommentParsedWithoutAllocating: every streamed attempt carries
// the engine's timing comment.
func TestTimingCommentParsedWithoutAllocating(t *testing.T) {
	comment := []byte(": tailgate-timing engine_ttft_ms=12.5  engine_queue_ms=0.25 other=x")
	st := data.UnknownStages()
	parseTiming(&st, comment)
	if st.EngineTTFT != 12500*time.Microsecond || st.EngineQueue != 250*time.Microsecond {
		t.Fatalf("engine ttft %v, queue %v; want 12.5ms, 250µs", st.EngineTTFT, st.EngineQueue)
	}
	sim := data.UnknownStages()
	parseTiming(&sim, []byte(": sim-queue-ms=3"))
	if sim.EngineQueue != 3*time.Millisecond {
		t.Fatalf("sim queue %v, want 3ms", sim.EngineQueue)
	}
	if n := testing.AllocsPerRun(100, func() { parseTiming(&st, comment) }); n != 0 {
		t.Errorf("parsing a timing comment allocates %.0f times, want 0", n)
	}
}
