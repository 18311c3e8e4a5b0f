package router

import "math"

// P2C is the default selection policy: power of two choices. It draws two
// candidates at random and takes the one with the lower load score. With
// affinity on it prefers the replica a request's prefix hashes to
// (rendezvous hashing), as long as that replica's score is within
// affinitySlack of the better of the two draws.
//
// A Registry builds its P2C from its Config (leave Config.Selector nil):
// the random source, the clock, slow start and affinity are the Config's.
// A P2C made any other way has none of them and is not usable.
type P2C struct {
	rand     func(n int) int
	score    scorer
	affinity bool
}

// affinitySlack is how much worse (as a factor) the replica a prefix
// prefers may score and still win.
const affinitySlack = 1.5

// newP2C takes what P2C needs from a Config with its defaults applied.
func newP2C(cfg Config) *P2C {
	// In session mode a request that names its session never reaches the
	// policy (the registry routes it), so prefix affinity here steers only
	// the requests that name none.
	prefix := cfg.Affinity == AffinityPrefix || cfg.Affinity == AffinitySession
	return &P2C{rand: cfg.Rand, score: scorer{now: cfg.Now, slowStart: cfg.SlowStart}, affinity: prefix}
}

// Select implements Selector.
func (p *P2C) Select(cands []*Replica, hint Hint) *Replica {
	if len(cands) == 1 {
		return cands[0]
	}
	fb := fallbackTTFT(cands)
	i := p.rand(len(cands))
	j := p.rand(len(cands) - 1)
	if j >= i {
		j++
	}
	a, b := cands[i], cands[j]
	sa, sb := p.score.inputs(a, fb).Score, p.score.inputs(b, fb).Score
	best, bestScore := a, sa
	if sb < sa {
		best, bestScore = b, sb
	}
	if p.affinity && hint.Prefix != 0 {
		pref := rendezvous(cands, hint.Prefix)
		if pref != best && p.score.inputs(pref, fb).Score <= bestScore*affinitySlack {
			return pref
		}
	}
	return best
}

// best is Select over every candidate instead of two drawn at random: the
// lowest score among the replicas with a free engine slot (all of them
// when none has one, or their slots are not known), prefix affinity as in
// Select. The registry uses it for interactive requests: they are few, so
// the herding two random draws guard against cannot happen, and they must
// find the free slot when batch work fills the rest — with two draws an
// interactive request lands behind a full engine whenever both draws are
// full, and by score alone whenever a full replica's recent TTFT is lower.
func (p *P2C) best(cands []*Replica, hint Hint) *Replica {
	fb := fallbackTTFT(cands)
	var best *Replica
	bestScore, bestFull := math.Inf(1), true
	for _, c := range cands {
		s, full := p.score.inputs(c, fb).Score, c.full()
		if (bestFull && !full) || (full == bestFull && s < bestScore) {
			best, bestScore, bestFull = c, s, full
		}
	}
	if p.affinity && hint.Prefix != 0 {
		pref := rendezvous(cands, hint.Prefix)
		if pref != best && p.score.inputs(pref, fb).Score <= bestScore*affinitySlack {
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
