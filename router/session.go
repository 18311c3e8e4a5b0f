package router

import (
	"container/list"
	"fmt"
	"math"
	"sync"
)

// Affinity says which requests the router keeps together on one replica,
// so the engine's prefix cache holds what their prompts share.
type Affinity int

const (
	// AffinityOff spreads requests by load alone.
	AffinityOff Affinity = iota
	// AffinityPrefix prefers the replica a request's prompt prefix hashes
	// to (rendezvous hashing) while its load score is within affinitySlack
	// of the better of P2C's two draws.
	AffinityPrefix
	// AffinitySession keeps a request that names its session
	// ([Hint.Session]) on the replica that served the session's last turn
	// while that replica's load is within [Config.LoadBound] of the mean;
	// a request that names none gets prefix affinity, as with
	// AffinityPrefix: a shared system prompt still finds its warm replica.
	AffinitySession
)

// DefaultAffinity is the mode the gateway's bare --affinity (or
// --affinity=true) turns on.
const DefaultAffinity = AffinitySession

func (a Affinity) String() string {
	switch a {
	case AffinityPrefix:
		return "prefix"
	case AffinitySession:
		return "session"
	}
	return "off"
}

// ParseAffinity maps the gateway's --affinity value to a mode: off,
// prefix or session; true (a bare --affinity) is [DefaultAffinity] and
// false is off.
func ParseAffinity(s string) (Affinity, error) {
	switch s {
	case "off", "false":
		return AffinityOff, nil
	case "prefix":
		return AffinityPrefix, nil
	case "session":
		return AffinitySession, nil
	case "true", "on":
		return DefaultAffinity, nil
	}
	return AffinityOff, fmt.Errorf("router: unknown affinity %q (want off, prefix or session)", s)
}

// DefaultSessions bounds the session table unless Config.Sessions says
// otherwise: 65,536 sessions, about 5 MiB.
const DefaultSessions = 1 << 16

// DefaultLoadBound is how far above the mean in-flight load a session's
// replica may be and still take its next turn, unless Config.LoadBound
// says otherwise.
const DefaultLoadBound = 1.25

// DefaultLoadSlack is how many requests above the mean a session's replica
// may hold whatever the factor, unless Config.LoadSlack says otherwise.
const DefaultLoadSlack = 2

// sessions remembers which replica served each recent session's last
// turn: a map and a recency list (least recently used out first, at most
// max entries). It is the same container/list LRU as serving/sim's prefix
// cache; the generic hashicorp/golang-lru/v2 is not in the module graph,
// and its v1 would box every key. Keys are hashes of the session names
// the gateway read; the names themselves are never kept.
type sessions struct {
	max int

	mu  sync.Mutex
	lru list.List // of *sessionEntry, most recent at the front
	at  map[uint64]*list.Element
}

type sessionEntry struct {
	key uint64
	rep *Replica
}

func newSessions(max int) *sessions {
	return &sessions{max: max, at: make(map[uint64]*list.Element)}
}

// get returns the replica of a session's last turn, nil for a session not
// (or no longer) known.
func (s *sessions) get(key uint64) *Replica {
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.at[key]; ok {
		s.lru.MoveToFront(el)
		return el.Value.(*sessionEntry).rep
	}
	return nil
}

// put makes rep the session's replica, forgetting the least recently used
// session when the table is full.
func (s *sessions) put(key uint64, rep *Replica) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.at[key]; ok {
		el.Value.(*sessionEntry).rep = rep
		s.lru.MoveToFront(el)
		return
	}
	s.at[key] = s.lru.PushFront(&sessionEntry{key: key, rep: rep})
	if s.lru.Len() > s.max {
		old := s.lru.Back()
		s.lru.Remove(old)
		delete(s.at, old.Value.(*sessionEntry).key)
	}
}

// len returns the number of sessions remembered.
func (s *sessions) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lru.Len()
}

// How a session's request was placed, for tailgate_session_routes_total.
const (
	sessionStayed    = "stayed"     // on the replica of its last turn
	sessionPlaced    = "placed"     // a session not known: its first turn, or forgotten
	sessionMovedGone = "moved_gone" // its replica is gone, draining, ejected, backing off or tried already
	sessionMovedLoad = "moved_load" // its replica was over the load bound
)

// pickSession chooses among cands for a request of a known session key:
// the replica of its last turn while that replica, with this request,
// stays within the load bound, else the first replica within the bound in
// the key's rendezvous order — the same order every gateway computes, so a
// session's first turn lands where another gateway would put it too, and a
// moved session lands on its next choice and stays there (the winner of
// its attempts becomes its replica, see Call.win).
//
// The bound is bounded-load consistent hashing's (Mirrokni, Thorup,
// Zadimoghaddam 2018) with an absolute slack: a replica may hold at most
// ⌈max(bound × mean, mean + slack)⌉ of the gateway's requests, the mean
// being (in flight + 1) / replicas, counting this one. From slack / (bound
// − 1) requests per replica up (8 at the defaults) the factor decides, so
// no replica is pushed above bound × the mean by affinity; below that a
// factor of the mean is less than one request, and the slack keeps a
// session home through a blip rather than re-prefilling its whole history
// elsewhere (bench --scenario multiturn: 18 % of turns moved without it,
// 1 % with it). The least loaded replica always fits, so a choice always
// exists.
func (r *Registry) pickSession(cands []*Replica, key uint64) (*Replica, string) {
	var total int64
	for _, c := range cands {
		total += c.Inflight()
	}
	mean := float64(total+1) / float64(len(cands))
	slack := float64(max(r.cfg.LoadSlack, 0)) // negative: none
	limit := int64(math.Ceil(max(r.cfg.LoadBound*mean, mean+slack)))
	fits := func(c *Replica) bool { return c.Inflight()+1 <= limit }
	outcome := sessionPlaced
	if home := r.sessions.get(key); home != nil {
		outcome = sessionMovedGone
		for _, c := range cands {
			if c == home {
				if fits(c) {
					return c, sessionStayed
				}
				outcome = sessionMovedLoad
			}
		}
	}
	var best, least *Replica
	var bestH uint64
	for _, c := range cands {
		if least == nil || c.Inflight() < least.Inflight() {
			least = c
		}
		if !fits(c) {
			continue
		}
		if h := mix(key ^ c.idHash); best == nil || h > bestH {
			best, bestH = c, h
		}
	}
	if best == nil { // in-flight counts moved while we looked
		best = least
	}
	return best, outcome
}

// homeSession makes rep the replica of the session key names, once an
// attempt there won: the next turn goes where this one's prefix is cached.
func (r *Registry) homeSession(key uint64, rep *Replica) {
	if key != 0 && r.sessions != nil {
		r.sessions.put(key, rep)
	}
}
