package data

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkOpenRowRefresh is the ledger's share of a stream's open row: 500
// open streams, each refreshed with the tokens it delivered, 100 rows a
// transaction (the writer's batches with 500 streams refreshed every
// 100 ms and flushed every 20 ms). upsert writes each refresh as a whole
// row, as InsertLedger does; writer goes through LedgerWriter.Open, which
// updates only the figures of a row stored already.
func BenchmarkOpenRowRefresh(b *testing.B) {
	const streams, batch = 500, 100
	for _, mode := range []string{"upsert", "writer"} {
		b.Run(mode, func(b *testing.B) {
			s := openTestStore(b)
			ctx := context.Background()
			w := s.NewLedgerWriter(LedgerConfig{}, nil)
			ran := make(chan error, 1)
			go func() { ran <- w.Run(ctx) }()
			rows := make([]LedgerRow, streams)
			for i := range rows {
				rows[i] = streamRow(fmt.Sprintf("req_%04d", i), 1, OutcomeOpen, 42, 1)
				w.Open(rows[i])
			}
			if err := w.Flush(ctx); err != nil {
				b.Fatal(err)
			}
			part := make([]LedgerRow, 0, batch)
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				part = part[:0]
				for j := range batch {
					r := &rows[(i+j)%streams]
					r.CompletionTokens++
					r.CostMicros++
					part = append(part, *r)
				}
				if mode == "upsert" {
					if err := s.InsertLedger(ctx, part); err != nil {
						b.Fatal(err)
					}
					continue
				}
				for _, r := range part {
					w.Open(r)
				}
				if err := w.Flush(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if err := w.Close(); err != nil {
				b.Fatal(err)
			}
			<-ran
			got, err := s.queryLedger(ctx, ledgerSelect+` WHERE l.id = ?`, rows[0].ID)
			if err != nil || len(got) != 1 || got[0].CompletionTokens != rows[0].CompletionTokens {
				b.Fatalf("open row %+v (%v), want %d completion tokens", got, err, rows[0].CompletionTokens)
			}
		})
	}
}
