package spool_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/spool"
)

// BenchmarkAppend is the cost of a durable append (write and fsync of a
// ~2 KB delivery), by number of concurrent callers: concurrent appends
// share group commits, so the ratio of 1 to 16 callers is the gain.
func BenchmarkAppend(b *testing.B) {
	for _, callers := range []int{1, 16} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			sp, err := spool.Open(spool.Options{Dir: b.TempDir() + "/spool"})
			if err != nil {
				b.Fatal(err)
			}
			defer sp.Close()
			b.SetParallelism(callers)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r := record("evt")
					r.Body = make([]byte, 2048)
					if err := sp.Append(context.Background(), r); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
