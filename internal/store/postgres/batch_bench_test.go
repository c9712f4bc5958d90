package postgres_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// BenchmarkLoneClaimComplete is one delivery at a time (c=1): a claim then
// a complete on a fresh event ID, batched (a batch of one each) and not.
func BenchmarkLoneClaimComplete(b *testing.B) {
	for _, mode := range []struct {
		name string
		opts store.BatchOptions
	}{{"batched", store.BatchOptions{}}, {"unbatched", store.BatchOptions{Disabled: true}}} {
		b.Run(mode.name, func(b *testing.B) {
			s := newStoreB(b, postgres.Options{Batch: mode.opts})
			b.ResetTimer()
			for n := range b.N {
				id := fmt.Sprintf("evt_%d", n)
				c, err := s.Claim(b.Context(), store.ClaimParams{Scope: "stripe", EventID: id, Lease: time.Minute})
				if err != nil || c.Outcome != store.Claimed {
					b.Fatal(c.Outcome, err)
				}
				if err := s.Complete(b.Context(), "stripe", id, c.Token, 200); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func newStoreB(b *testing.B, opts postgres.Options) *postgres.Store {
	b.Helper()
	dsn := defaultTestDSN
	if v := os.Getenv("TEST_DATABASE_URL"); v != "" {
		dsn = v
	}
	opts.DSN, opts.Table = dsn, tableName()
	s, err := postgres.New(b.Context(), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_, _ = s.Pool().Exec(context.Background(), "DROP TABLE IF EXISTS "+opts.Table+", "+opts.Table+"_goose_version")
		_, _ = s.Pool().Exec(context.Background(), "DROP FUNCTION IF EXISTS "+opts.Table+"_commit, "+opts.Table+"_claim")
		_ = s.Close()
	})
	return s
}
