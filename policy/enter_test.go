package policy

import "testing"

// TestEnterTakesTheKeysPlaceBeforeAdmission: Enter takes a concurrency
// slot and a request of the key's limits; AdmitEntered does not take them
// again, its Ticket gives the slot back when settled; Leave gives back
// both for a request that was never admitted.
func TestEnterTakesTheKeysPlaceBeforeAdmission(t *testing.T) {
	g, p, _ := limitedGate(t, KeyOptions{MaxConcurrency: 2, RPM: 3})
	e1, _, err := g.Enter(p)
	if err != nil {
		t.Fatal(err)
	}
	e2, _, err := g.Enter(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.Enter(p); err == nil {
		t.Fatal("a third request entered with a concurrency of 2")
	} else {
		wantLimit(t, err, "concurrency")
	}
	tk, _, err := g.AdmitEntered(p, e1, Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	e1.Leave() // admitted: the ticket holds the slot
	if _, _, err := g.Enter(p); err == nil {
		t.Fatal("a request entered while two hold the key's slots")
	}
	e2.Leave()
	e3, rs, err := g.Enter(p)
	if err != nil {
		t.Fatalf("after a request left: %v", err)
	}
	if rs.RemainingRequests != 1 {
		t.Fatalf("%d requests left of 3 with two taken (one given back), want 1", rs.RemainingRequests)
	}
	tk.Release()
	e3.Leave()
	if _, _, err := g.Enter(p); err != nil {
		t.Fatalf("with every slot given back: %v", err)
	}
}
