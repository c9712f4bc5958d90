package postgres

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/coalesce"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	pgstore "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// BenchmarkEnqueue compares, for one enqueue at a time and 32 concurrent
// ones, of distinct events:
//
//	one         a transaction per enqueue (BatchOptions.Disabled)
//	sequential  batches in one transaction, each entry's statements run in
//	            turn inside a savepoint (several round trips per entry, one
//	            commit per batch): the alternative the set-based statement
//	            was measured against
//	batched     the set-based batch (writeBatch): one statement per round,
//	            one round trip and one commit per batch
//
// Run: TEST_DATABASE_URL=... go test -run '^$' -bench Enqueue -benchtime 4000x ./internal/queue/postgres/
func BenchmarkEnqueue(b *testing.B) {
	dsn := os.Getenv("TEST_DATABASE_URL")
	if dsn == "" {
		b.Skip("TEST_DATABASE_URL is not set")
	}
	for _, conc := range []int{1, 32} {
		for _, mode := range []string{"one", "sequential", "batched"} {
			b.Run(fmt.Sprintf("%s/%d", mode, conc), func(b *testing.B) { benchEnqueue(b, dsn, mode, conc) })
		}
	}
}

func benchEnqueue(b *testing.B, dsn, mode string, conc int) {
	ctx := context.Background()
	table := "qbench_" + store.NewToken()[:8]
	s, err := pgstore.New(ctx, pgstore.Options{DSN: dsn, Table: table, MaxConns: 40})
	if err != nil {
		b.Skipf("PostgreSQL unreachable: %v", err)
	}
	defer func() {
		_ = Drop(ctx, s.Pool(), s.Table())
		_ = s.Close()
	}()
	q, err := New(ctx, s, Options{Batch: BatchOptions{Disabled: mode == "one"}})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	if mode == "sequential" {
		q.batch = coalesce.New(coalesce.Options{}, q.writeSequential)
	}
	var n atomic.Int64
	enqueue := func() bool {
		id := fmt.Sprintf("evt_%d", n.Add(1))
		out, err := q.Enqueue(ctx, benchEntry(id))
		if err != nil || out.Outcome != queue.Queued {
			b.Errorf("%s: %v %v", id, out.Outcome, err)
			return false
		}
		return true
	}
	b.ResetTimer()
	if conc == 1 {
		for range b.N {
			if !enqueue() {
				return
			}
		}
		return
	}
	b.SetParallelism(max(1, conc/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !enqueue() {
				return
			}
		}
	})
}

func benchEntry(id string) queue.Entry {
	return queue.Entry{
		Scope: "s", EventID: id,
		Request: queue.Request{Method: http.MethodPost, URI: "/webhooks/stripe",
			Header: http.Header{"Content-Type": {"application/json"}, "Stripe-Signature": {"t=1,v1=ab"}},
			Body:   []byte(`{"id":"` + id + `","object":"event","type":"payment_intent.succeeded"}`)},
		Claims:      []queue.Key{{Scope: "s", EventID: id}},
		ClaimStatus: 202,
	}
}

// writeSequential is the sequential alternative: the batch's entries one
// after the other in one transaction, each in a savepoint that a refused
// claim rolls back to.
func (q *Queue) writeSequential(ctx context.Context, ops []*enqueueOp) error {
	tx, err := q.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	claims := q.store.InTx(tx)
	for _, o := range ops {
		e := o.e
		if _, err := tx.Exec(ctx, "SAVEPOINT enqueue"); err != nil {
			return err
		}
		o.out = queue.Enqueued{Outcome: queue.Queued, Refused: -1}
		for i, k := range e.Claims {
			out, retry, err := claim(ctx, claims, k, e.ClaimStatus, e.HoldOnExpiry)
			if err != nil {
				return err
			}
			if out != queue.Queued {
				o.out = queue.Enqueued{Outcome: out, Refused: i, RetryAfter: retry}
				break
			}
		}
		if o.out.Outcome != queue.Queued {
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT enqueue"); err != nil {
				return err
			}
			continue
		}
		err := tx.QueryRow(ctx, q.sql.insert, e.Scope, e.EventID, e.OrderKey, e.Request.Method, e.Request.URI,
			o.hjson, e.Request.Body).Scan(&o.out.ID)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT enqueue"); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}
