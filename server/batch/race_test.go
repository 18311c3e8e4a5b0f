//go:build race

package batch_test

// raceEnabled: the race detector slows SQLite (pure Go) some 30 times.
const raceEnabled = true
