package policy

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
)

// TestExpiredKeyIsRefusedSayingWhen: a key works until its expiry and is
// refused from then on — even from the cache, with no change to the keys
// version — with an error that says it expired and when, distinct from an
// unknown key's; extending the expiry makes it work again.
func TestExpiredKeyIsRefusedSayingWhen(t *testing.T) {
	st, path := openStore(t)
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	clk := &clock{t: exp.Add(-time.Minute)}
	g := newGate(t, st, Config{Now: clk.Now, PollInterval: 5 * time.Millisecond})
	runGate(t, g)
	secret, k := createKey(t, st, KeyOptions{Tenant: "acme", ExpiresAt: exp})

	authenticate(t, g, secret) // before expiry, and now cached
	clk.Advance(time.Minute)
	_, err := g.Authenticate(context.Background(), secret)
	var ee *ExpiredKeyError
	if !errors.As(err, &ee) || !ee.ExpiresAt.Equal(exp) || !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("at expiry: %v, want an ExpiredKeyError at %v that is an ErrInvalidKey", err, exp)
	}
	if want := "expired at " + exp.Format(time.RFC3339); !strings.Contains(err.Error(), want) {
		t.Errorf("message %q lacks %q", err, want)
	}
	if _, err := g.PrincipalForKey(context.Background(), k.ID); !errors.As(err, &ee) {
		t.Errorf("PrincipalForKey of an expired key: %v", err)
	}
	unknown, _, _, _ := NewSecret()
	if _, err := g.Authenticate(context.Background(), unknown); !errors.Is(err, ErrInvalidKey) || errors.As(err, &ee) {
		t.Errorf("unknown key: %v, want a plain ErrInvalidKey", err)
	}

	// Another process extends it; the gate picks that up.
	later := exp.Add(24 * time.Hour)
	if _, err := EditKey(context.Background(), openSecond(t, path), k.Prefix, data.KeyUpdate{ExpiresAt: &later}); err != nil {
		t.Fatal(err)
	}
	within(t, 2*time.Second, "extended key accepted", func() bool {
		_, err := g.Authenticate(context.Background(), secret)
		return err == nil
	})
}

func TestParseExpiry(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Time
	}{
		{"30d", now.Add(30 * 24 * time.Hour)},
		{"720h", now.Add(720 * time.Hour)},
		{"1.5d", now.Add(36 * time.Hour)},
		{"2027-01-31T00:00:00Z", time.Date(2027, 1, 31, 0, 0, 0, 0, time.UTC)},
		{"2027-01-31T02:00:00+02:00", time.Date(2027, 1, 31, 0, 0, 0, 0, time.UTC)},
		{"never", time.Time{}},
	} {
		got, err := ParseExpiry(tc.in, now)
		if err != nil || !got.Equal(tc.want) {
			t.Errorf("ParseExpiry(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "30", "-1d", "0d", "xd", "soon", "2027-01-31", "-5h"} {
		if _, err := ParseExpiry(bad, now); err == nil {
			t.Errorf("ParseExpiry(%q) accepted", bad)
		}
	}
	// A new key must not be born expired.
	st, _ := openStore(t)
	if _, _, err := CreateKey(context.Background(), st, KeyOptions{Tenant: "acme", ExpiresAt: time.Now().Add(-time.Hour)}); err == nil ||
		!strings.Contains(err.Error(), "not in the future") {
		t.Errorf("key expiring in the past: %v", err)
	}
}

// TestEditKeyAppliesToARunningGate: lowering a key's RPM through another
// store handle (as `tailgate keys edit` does) makes the running gate refuse
// the key's next request beyond it; a models edit restricts the key, and
// clearing the list frees it.
func TestEditKeyAppliesToARunningGate(t *testing.T) {
	st, path := openStore(t)
	clk := newClock()
	g := newGate(t, st, Config{Now: clk.Now, PollInterval: 5 * time.Millisecond})
	runGate(t, g)
	secret, k := createKey(t, st, KeyOptions{Tenant: "acme"})
	admit := func() error {
		p, err := g.Authenticate(context.Background(), secret)
		if err != nil {
			return err
		}
		tk, _, err := g.Admit(p, Request{Model: "llama", MaxTokens: 1})
		if err == nil {
			tk.Release()
		}
		return err
	}
	for range 5 {
		if err := admit(); err != nil {
			t.Fatalf("unlimited key: %v", err)
		}
	}
	other := openSecond(t, path)
	got, err := EditKey(context.Background(), other, secret, data.KeyUpdate{RPM: ptr(1), Models: &[]string{"llama"}})
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != k.ID || got.RPM != 1 || !slices.Equal(got.Models, []string{"llama"}) {
		t.Fatalf("edited key %+v", got)
	}
	within(t, 2*time.Second, "rpm 1 applied", func() bool {
		admit()
		var le *LimitError
		return errors.As(admit(), &le) && le.Limit == "requests"
	})
	p := authenticate(t, g, secret)
	if p.Allows("qwen") || !p.Allows("llama") {
		t.Fatalf("models after edit: %v", p.Models)
	}
	if _, err := EditKey(context.Background(), other, k.ID, data.KeyUpdate{Models: &[]string{}}); err != nil {
		t.Fatal(err)
	}
	within(t, 2*time.Second, "models cleared", func() bool { return authenticate(t, g, secret).Allows("qwen") })

	for _, tc := range []struct {
		name string
		ref  string
		u    data.KeyUpdate
		want error
	}{
		{"nothing to change", k.ID, data.KeyUpdate{}, nil},
		{"negative", k.ID, data.KeyUpdate{TPM: ptr(-1)}, nil},
		{"empty model", k.ID, data.KeyUpdate{Models: &[]string{"llama", " "}}, nil},
		{"unknown", "tg-nosuch1", data.KeyUpdate{RPM: ptr(1)}, data.ErrNotFound},
	} {
		_, err := EditKey(context.Background(), other, tc.ref, tc.u)
		if err == nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// TestSetBudgetAppliesToARunningGate: a lowered token budget refuses the
// next request that does not fit; an unknown tenant is not created.
func TestSetBudgetAppliesToARunningGate(t *testing.T) {
	st, path := openStore(t)
	g := newGate(t, st, Config{PollInterval: 5 * time.Millisecond})
	runGate(t, g)
	secret, _ := createKey(t, st, KeyOptions{Tenant: "acme"})
	p := authenticate(t, g, secret)
	tk, _, err := g.Admit(p, Request{Model: "llama", MaxTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	tk.Settle(Usage{PromptTokens: 10, CompletionTokens: 40})

	other := openSecond(t, path)
	tn, err := SetBudget(context.Background(), other, "acme", ptr(60), nil)
	if err != nil || tn.BudgetTokens != 60 || tn.BudgetMicros != 0 {
		t.Fatalf("SetBudget: %+v %v", tn, err)
	}
	within(t, 2*time.Second, "lowered budget applied", func() bool {
		tk, _, err := g.Admit(p, Request{Model: "llama", MaxTokens: 20})
		if err == nil {
			tk.Release()
		}
		var qe *QuotaError
		return errors.As(err, &qe) && qe.Limit == 60 && qe.Spent == 50
	})
	if _, err := SetBudget(context.Background(), other, "acme", nil, ptr(5)); err != nil {
		t.Fatal(err)
	}
	if tn, _ := other.TenantByName(context.Background(), "acme"); tn.BudgetTokens != 60 || tn.BudgetMicros != 5 {
		t.Errorf("only the given part changes: %+v", tn)
	}
	if _, err := SetBudget(context.Background(), other, "acmee", ptr(1), nil); !errors.Is(err, data.ErrNotFound) {
		t.Errorf("unknown tenant: %v", err)
	}
	if ts, _ := other.Tenants(context.Background()); len(ts) != 1 {
		t.Errorf("tenants %+v: a typo made one", ts)
	}
	if _, err := SetBudget(context.Background(), other, "acme", nil, nil); err == nil {
		t.Error("SetBudget with nothing to change succeeded")
	}
}
