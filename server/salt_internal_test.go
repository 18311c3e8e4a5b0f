package server

import "testing"

// A tenant's salt is the same whichever tenants came between its requests:
// one whose remembered slot another tenant took derives the same salt
// again, and two tenants never share one.
func TestCacheSaltOfATenantStaysWhenItsSlotIsTaken(t *testing.T) {
	c := &cacheSalts{secret: []byte("secret")}
	first := c.of(7)
	if len(first) != 22 {
		t.Fatalf("salt %q: want 22 characters of base64url", first)
	}
	other := c.of(7 + saltSlots) // the same slot
	if other == first {
		t.Fatalf("tenants 7 and %d share the salt %q", 7+saltSlots, first)
	}
	if again := c.of(7); again != first {
		t.Fatalf("tenant 7's salt is %q after another took its slot, %q before", again, first)
	}
	if again := (&cacheSalts{secret: []byte("secret")}).of(7 + saltSlots); again != other {
		t.Fatalf("tenant %d's salt is %q derived anew, %q remembered", 7+saltSlots, again, other)
	}
}
