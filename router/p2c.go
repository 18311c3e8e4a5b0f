package router

import "time"

// P2C is the default selection policy: power of two choices. It draws two
// candidates at random and takes the one with the lower load score. With
// Affinity set it prefers the replica a request's prefix hashes to
// (rendezvous hashing), as long as that replica's score is within
// AffinitySlack of the better of the two draws.
type P2C struct {
	// Rand returns a random int in [0,n).
	Rand func(n int) int
	// Now is the clock (for slow start).
	Now func() time.Time
	// SlowStart is how long a freshly ready replica ramps up; 0 disables.
	SlowStart time.Duration
	// Affinity enables prefix affinity.
	Affinity bool
	// AffinitySlack is how much worse (as a factor) the preferred replica's
	// score may be and still win; 0 means 1.5.
	AffinitySlack float64
}

// Select implements Selector.
func (p *P2C) Select(cands []*Replica, hint Hint) *Replica {
	if len(cands) == 1 {
		return cands[0]
	}
	sc := scorer{now: p.Now, slowStart: p.SlowStart}
	fb := fallbackTTFT(cands)
	i := p.Rand(len(cands))
	j := p.Rand(len(cands) - 1)
	if j >= i {
		j++
	}
	a, b := cands[i], cands[j]
	sa, sb := sc.inputs(a, fb).Score, sc.inputs(b, fb).Score
	best, bestScore := a, sa
	if sb < sa {
		best, bestScore = b, sb
	}
	if p.Affinity && hint.Prefix != 0 {
		pref := rendezvous(cands, hint.Prefix)
		slack := p.AffinitySlack
		if slack <= 0 {
			slack = 1.5
		}
		if pref != best && sc.inputs(pref, fb).Score <= bestScore*slack {
			return pref
		}
	}
	return best
}

// rendezvous returns the candidate with the highest hash of (prefix, id):
// stable as replicas come and go, only the keys of a departed replica move.
func rendezvous(cands []*Replica, prefix uint64) *Replica {
	var best *Replica
	var bestH uint64
	for _, r := range cands {
		h := mix(prefix ^ r.idHash)
		if best == nil || h > bestH {
			best, bestH = r, h
		}
	}
	return best
}

// mix is a 64-bit finaliser (splitmix64).
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
