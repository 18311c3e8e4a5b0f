package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestUpScreenShowsARepeatedLineOnceAMinute: an hour of the same warnings
// (a refused key, a scrape that timed out, a no_replica answer) every 10 s
// is a line a minute for each on up's terminal, the line after a quiet
// minute saying how many were held back; a line seen once is shown once.
func TestUpScreenShowsARepeatedLineOnceAMinute(t *testing.T) {
	var out bytes.Buffer
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	con := &console{w: &out}
	log := slog.New(repeatLimit{slog.NewTextHandler(con, nil), newRepeats(time.Minute, func() time.Time { return now })})
	con.println("ready: 2/2 replicas — API http://127.0.0.1:8080/v1")
	log.Warn("something new")
	for range 360 { // an hour, every 10 s
		log.Warn("request refused", "code", "invalid_api_key")
		log.Warn("scrape engine metrics timed out", "replica", "worker-1")
		log.Warn("no replica could take the request", "model", "tailgate-sim")
		now = now.Add(10 * time.Second)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if n := len(lines); n > 1+1+3*61 {
		t.Fatalf("%d lines for an hour of 3 warnings every 10 s, want at most one a minute each:\n%s", n, strings.Join(lines[:20], "\n"))
	}
	counts := map[string]int{}
	for _, l := range lines[2:] {
		for _, m := range []string{"request refused", "scrape engine metrics", "no replica could"} {
			if strings.Contains(l, m) {
				counts[m]++
			}
		}
	}
	for m, n := range counts {
		if n < 55 || n > 61 {
			t.Errorf("%q shown %d times in an hour, want once a minute", m, n)
		}
	}
	if !strings.Contains(lines[5], `msg="request refused"`) || !strings.Contains(lines[5], "repeated=5") {
		t.Errorf("the second minute's line does not say how many were held back:\n%s", strings.Join(lines[:8], "\n"))
	}
	if !strings.Contains(lines[0], "ready: ") || strings.Count(out.String(), "something new") != 1 {
		t.Errorf("first lines:\n%s", strings.Join(lines[:3], "\n"))
	}
}
