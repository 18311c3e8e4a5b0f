//go:build !race

package server_test

// raceAllocs is the extra allocations per request the race detector causes
// (sync.Pool drops items at random under it).
const raceAllocs = 0
