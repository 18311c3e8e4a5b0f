package policy

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
)

func TestAuthenticateResolvesPrincipal(t *testing.T) {
	st, _ := openStore(t)
	g := newGate(t, st, Config{})
	secret, k := createKey(t, st, KeyOptions{Tenant: "acme", RPM: 10, TPM: 20, MaxConcurrency: 3, Models: []string{"llama"}})

	p := authenticate(t, g, secret)
	if p.KeyID != k.ID || p.KeyPrefix != secret[:11] || p.TenantID != k.Tenant.ID || p.Tenant != "acme" ||
		p.RPM != 10 || p.TPM != 20 || p.MaxConcurrency != 3 || !slices.Equal(p.Models, []string{"llama"}) {
		t.Fatalf("principal %+v", p)
	}
	if !p.Allows("llama") || p.Allows("gpt") {
		t.Fatal("Allows does not follow the key's models")
	}
	if p2 := authenticate(t, g, secret); p2 != p {
		t.Fatal("second Authenticate did not come from the cache")
	}
	if !(&Principal{}).Allows("anything") {
		t.Fatal("a key without models should allow every model")
	}
}

func TestAuthenticateRejectsMalformedWithoutStore(t *testing.T) {
	st, _ := openStore(t)
	g := newGate(t, st, Config{})
	good, _, _, _ := NewSecret()
	st.Close() // a malformed secret must not need the store

	for _, s := range []string{
		"", "tg-", "sk-" + good[3:], good + "x", good[:45], "Bearer " + good,
		good[:20] + "!" + good[21:], good[:20] + "=" + good[21:], strings.ToUpper(good[:3]) + good[3:],
	} {
		if _, err := g.Authenticate(context.Background(), s); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("Authenticate(%q) = %v, want ErrInvalidKey", s, err)
		}
	}
}

func TestNegativeCacheSparesStore(t *testing.T) {
	st, _ := openStore(t)
	g := newGate(t, st, Config{})
	good, _ := createKey(t, st, KeyOptions{Tenant: "acme"})
	bad, _, _, _ := NewSecret()
	unseen, _, _, _ := NewSecret()

	authenticate(t, g, good)
	if _, err := g.Authenticate(context.Background(), bad); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("bad key: %v", err)
	}
	// With the store closed, anything that reaches SQLite fails with a
	// store error, not ErrInvalidKey.
	st.Close()
	if _, err := g.Authenticate(context.Background(), unseen); err == nil || errors.Is(err, ErrInvalidKey) {
		t.Fatalf("unseen key with closed store: %v, want a store error", err)
	}
	for range 1000 {
		if _, err := g.Authenticate(context.Background(), bad); !errors.Is(err, ErrInvalidKey) {
			t.Fatalf("cached bad key: %v", err)
		}
		if _, err := g.Authenticate(context.Background(), good); err != nil {
			t.Fatalf("cached good key: %v", err)
		}
	}
	// A store error is not cached as a bad key.
	if _, err := g.Authenticate(context.Background(), unseen); errors.Is(err, ErrInvalidKey) {
		t.Fatal("a store failure was cached as an invalid key")
	}
}

func TestRevokedKeyRejectedWithinOnePoll(t *testing.T) {
	for _, by := range []string{"id", "prefix", "secret"} {
		t.Run(by, func(t *testing.T) {
			st, path := openStore(t)
			g := newGate(t, st, Config{PollInterval: 20 * time.Millisecond})
			runGate(t, g)
			secret, k := createKey(t, st, KeyOptions{Tenant: "acme"})
			authenticate(t, g, secret) // now cached

			ref := map[string]string{"id": k.ID, "prefix": k.Prefix, "secret": secret}[by]
			cli := openSecond(t, path)
			rk, err := RevokeKey(context.Background(), cli, ref)
			if err != nil {
				t.Fatal(err)
			}
			if rk.ID != k.ID || !rk.Revoked() {
				t.Fatalf("revoked %+v", rk)
			}
			within(t, time.Second, "revocation", func() bool {
				_, err := g.Authenticate(context.Background(), secret)
				return errors.Is(err, ErrInvalidKey)
			})
		})
	}
}

func TestKeyCreatedElsewhereAcceptedDespiteNegativeCache(t *testing.T) {
	ctx := context.Background()
	st, path := openStore(t)
	g := newGate(t, st, Config{PollInterval: 20 * time.Millisecond})
	runGate(t, g)

	secret, prefix, hash, err := NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Authenticate(ctx, secret); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("before creation: %v", err)
	}
	cli := openSecond(t, path)
	tn, err := cli.EnsureTenant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.CreateKey(ctx, data.Key{Tenant: tn, Prefix: prefix, Hash: hash}); err != nil {
		t.Fatal(err)
	}
	within(t, time.Second, "new key accepted", func() bool {
		p, err := g.Authenticate(ctx, secret)
		return err == nil && p.Tenant == "acme"
	})

	// A key never tried before is accepted at once, without waiting for a poll.
	fresh, _ := createKey(t, cli, KeyOptions{Tenant: "acme"})
	authenticate(t, g, fresh)
}

func TestStaleLookupCannotRepopulateClearedCache(t *testing.T) {
	// A lookup that read the key before a refresh but stores its answer
	// after it must not be served.
	ctx := context.Background()
	st, _ := openStore(t)
	g := newGate(t, st, Config{})
	secret, k := createKey(t, st, KeyOptions{Tenant: "acme"})
	authenticate(t, g, secret)

	sum := sha256.Sum256([]byte(secret))
	ck := binary.LittleEndian.Uint64(sum[:8])
	stale, ok := g.cache.Get(ck)
	if !ok || stale.p == nil {
		t.Fatal("key not cached")
	}
	if _, err := RevokeKey(ctx, st, k.ID); err != nil {
		t.Fatal(err)
	}
	if err := g.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	g.cache.Set(ck, stale, 1) // the racing lookup's late write
	g.cache.Wait()
	if _, err := g.Authenticate(ctx, secret); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("after revocation: %v, want ErrInvalidKey", err)
	}
}

func TestRefreshKeepsLimiterState(t *testing.T) {
	// Dropping the cache must not reset a key's rate limits or in-flight
	// count: the new Principal shares the old one's state.
	ctx := context.Background()
	clk := newClock()
	st, _ := openStore(t)
	g := newGate(t, st, Config{Now: clk.Now})
	secret, _ := createKey(t, st, KeyOptions{Tenant: "acme", RPM: 1, MaxConcurrency: 1})
	p := authenticate(t, g, secret)
	tk, _, err := g.Admit(p, Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	createKey(t, st, KeyOptions{Tenant: "other"}) // bumps the version
	if err := g.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	p2 := authenticate(t, g, secret)
	if p2 == p {
		t.Fatal("refresh kept the cached principal")
	}
	var le *LimitError
	if _, _, err := g.Admit(p2, Request{Model: "m"}); !errors.As(err, &le) || le.Limit != "concurrency" {
		t.Fatalf("err = %v, want concurrency limit", err)
	}
	tk.Release()
	if _, _, err := g.Admit(p2, Request{Model: "m"}); !errors.As(err, &le) || le.Limit != "requests" {
		t.Fatalf("err = %v, want requests limit", err)
	}
}

func TestAuthenticateDuringRefresh(t *testing.T) {
	// Lookups racing cache drops: good keys keep working, bad keys keep
	// failing, and nothing deadlocks (run with -race).
	ctx := context.Background()
	st, path := openStore(t)
	g := newGate(t, st, Config{})
	var good []string
	for range 4 {
		s, _ := createKey(t, st, KeyOptions{Tenant: "acme"})
		good = append(good, s)
	}
	bad, _, _, _ := NewSecret()
	cli := openSecond(t, path)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := g.Authenticate(ctx, good[(i+n)%len(good)]); err != nil {
					t.Errorf("good key: %v", err)
					return
				}
				if _, err := g.Authenticate(ctx, bad); !errors.Is(err, ErrInvalidKey) {
					t.Errorf("bad key: %v", err)
					return
				}
			}
		})
	}
	for range 30 {
		createKey(t, cli, KeyOptions{Tenant: "other"})
		if err := g.refresh(ctx); err != nil {
			t.Error(err)
			break
		}
	}
	close(stop)
	wg.Wait()
}
