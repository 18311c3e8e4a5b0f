package router

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
)

// TestExcludedReplicaIsNeverChosen: a request that excludes a replica has
// no attempt there — first, retry or hedge — although it is the
// best-scored replica and nothing else (health, backoff) keeps it out.
func TestExcludedReplicaIsNeverChosen(t *testing.T) {
	first := func(int) int { return 0 } // P2C compares the first two candidates
	// a is idle; b and c are busy, so a scores best.
	fleet := func(cfg Config) (*Registry, *Replica) {
		reg := newRegistry(t, cfg)
		a := reg.Add(readyReplica("a", "m"))
		reg.Add(readyReplica("b", "m")).inflight.Store(3)
		reg.Add(readyReplica("c", "m")).inflight.Store(3)
		return reg, a
	}
	record := func(seen *[]string, mu *sync.Mutex, open OpenFunc) OpenFunc {
		return func(ctx context.Context, rep *Replica, n int, reason AttemptReason) (Attempt, error) {
			mu.Lock()
			*seen = append(*seen, rep.ID+"/"+reason.String())
			mu.Unlock()
			return open(ctx, rep, n, reason)
		}
	}
	answer := func(context.Context, *Replica, int, AttemptReason) (Attempt, error) { return &fakeAttempt{}, nil }

	t.Run("best scored without it", func(t *testing.T) {
		reg, _ := fleet(Config{Rand: first})
		res, err := reg.Do(context.Background(), hint("m"), answer)
		if err != nil || res.Replica.ID != "a" {
			t.Fatalf("Do = %v, %v; want a, the best scored", res.Replica, err)
		}
		res.Finish()
	})
	t.Run("first attempt and retry", func(t *testing.T) {
		reg, a := fleet(Config{Rand: first})
		exclude := make([]*Replica, 1, 4)
		exclude[0] = a
		var (
			seen []string
			mu   sync.Mutex
		)
		req := Request{Hint: Hint{Model: "m"}, Exclude: exclude}
		res, err := reg.Do(context.Background(), req, record(&seen, &mu, func(_ context.Context, _ *Replica, n int, _ AttemptReason) (Attempt, error) {
			if n == 1 {
				return nil, ErrNotSent(errors.New("connection refused"))
			}
			return &fakeAttempt{}, nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		res.Finish()
		res.Losers()
		if !slices.Equal(seen, []string{"b/first", "c/retry"}) {
			t.Fatalf("attempts %v: want b first and the retry on c, never a", seen)
		}
		if spare := exclude[:cap(exclude)]; spare[1] != nil {
			t.Fatalf("Do wrote %s into the caller's Exclude array", spare[1].ID)
		}
	})
	t.Run("hedge", func(t *testing.T) {
		reg, ev := primed(t, Config{Rand: first})
		a, b := reg.Get("a"), reg.Get("b")
		c := reg.Add(readyReplica("c", "m"))
		b.inflight.Store(3)
		c.inflight.Store(3)
		var (
			seen    []string
			mu      sync.Mutex
			aborted sync.Map
		)
		req := Request{Hint: Hint{Model: "m"}, Exclude: []*Replica{a}}
		res, err := reg.Do(context.Background(), req, record(&seen, &mu, slowFirst(&aborted)))
		if err != nil {
			t.Fatal(err)
		}
		res.Finish()
		res.Losers()
		if !res.Hedged || ev.attempts() != 1 || !slices.Equal(seen, []string{"b/first", "c/hedge"}) {
			t.Fatalf("hedged %v, attempts %v: want b first and the hedge on c, never a", res.Hedged, seen)
		}
	})
	t.Run("nothing else left", func(t *testing.T) {
		reg := newRegistry(t, Config{})
		a := reg.Add(readyReplica("a", "m"))
		calls := 0
		_, err := reg.Do(context.Background(), Request{Hint: Hint{Model: "m"}, Exclude: []*Replica{a}},
			func(context.Context, *Replica, int, AttemptReason) (Attempt, error) {
				calls++
				return &fakeAttempt{}, nil
			})
		if !errors.Is(err, ErrNoReplica) || calls != 0 {
			t.Fatalf("Do = %v after %d attempts; want ErrNoReplica and none", err, calls)
		}
	})
}
