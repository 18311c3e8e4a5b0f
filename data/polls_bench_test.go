package data

import (
	"context"
	"testing"
	"time"
)

// BenchmarkPolls is the read a gateway makes on every poll of keys
// (policy's PollInterval, 250 ms) and of the batch executor's.
//
//	go test ./data -run '^$' -bench Polls -benchmem -count 6
func BenchmarkPolls(b *testing.B) {
	s := openTestStore(b)
	ctx := context.Background()
	b.Run("KeysVersion", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.KeysVersion(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("UnfinishedBatches", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.UnfinishedBatches(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("DeleteExpiredFiles", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.DeleteExpiredFiles(ctx, time.Now(), 100); err != nil {
				b.Fatal(err)
			}
		}
	})
}
