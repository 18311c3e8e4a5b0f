package sidecar

import (
	"slices"
	"sync"
	"time"
)

// ttftSamples is how many recent engine TTFTs the median is taken over.
const ttftSamples = 64

// ttftRing keeps the most recent engine TTFTs. For a JSON answer the sample
// is the whole engine time, as reported in its header.
type ttftRing struct {
	mu   sync.Mutex
	buf  [ttftSamples]time.Duration
	n    int // samples held, up to ttftSamples
	next int
}

func (r *ttftRing) add(d time.Duration) {
	r.mu.Lock()
	r.buf[r.next] = d
	r.next = (r.next + 1) % ttftSamples
	r.n = min(r.n+1, ttftSamples)
	r.mu.Unlock()
}

// median returns the median of the samples held, 0 when there are none.
func (r *ttftRing) median() time.Duration {
	var s [ttftSamples]time.Duration
	r.mu.Lock()
	n := r.n
	copy(s[:], r.buf[:n])
	r.mu.Unlock()
	if n == 0 {
		return 0
	}
	v := s[:n]
	slices.Sort(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
