package store

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/coalesce"
)

// Defaults of BatchOptions.
const (
	DefaultMaxBatch     = coalesce.DefaultMaxBatch // 128
	DefaultBatchTimeout = coalesce.DefaultTimeout  // 5s
)

// ErrClosed is returned by an operation submitted to a closed store.
var ErrClosed = errors.New("store closed")

// BatchOptions configure the coalescer of a store whose driver is a
// BatchDriver (group commit, after River's batch completer): claims and
// settles that arrive while a batch is being written wait for the next
// one, written in one transaction by one of the waiting callers (see
// batcher). Zero values mean the defaults.
type BatchOptions struct {
	// Disabled writes each operation with its own statement and commit.
	Disabled bool
	// MaxBatch bounds the operations (claims plus settles) of one
	// transaction. Defaults to DefaultMaxBatch (128).
	MaxBatch int
	// MaxWait is how long a writer waits for more operations before
	// writing a batch that is not full. Defaults to 0:
	// natural batching only (what queued while the previous batch was
	// written), so a lone delivery never waits.
	MaxWait time.Duration
	// Writers is how many batches may be written at once: while one
	// waits for its commit, the next is written on another connection
	// (PostgreSQL then flushes their commits together). Defaults to 1;
	// the postgres store defaults it to its DefaultBatchWriters. A single
	// writer makes the biggest batches; several, the shortest waits.
	Writers int
	// Timeout bounds the writing of one batch (its statements and commit).
	// Defaults to DefaultBatchTimeout (5s).
	Timeout time.Duration
	// Observe, when set, is told the size of each batch written: op is
	// "claim", "complete", "release" or "hold" with the count of that kind, and
	// "transaction" with the batch's total. Called by the goroutine writing
	// the batch, before it is written: it must be quick.
	Observe func(op string, n int)
}

// batcher is the store's coalescer (see package coalesce): claims and
// settles of concurrent deliveries are written together, one WriteBatch
// per batch, by one of the waiting callers.
type batcher struct {
	d    BatchDriver
	opts BatchOptions
	c    *coalesce.Coalescer[*op]
}

// op is one caller's claim or settle, filled in by write.
type op struct {
	claim  *BatchClaim
	settle *BatchSettle
	// follows is set by the writer on a claim whose (scope, event ID) an
	// earlier claim of the same batch carries: its result is derived from
	// the leader's, as if it had run right after it.
	follows *BatchClaim
	// state decides, once, who owns the result of an op whose caller's
	// context ended while its batch was being written: the caller
	// (opAbandoned, set by abandon) or the writer (opWritten, set once the
	// batch committed and the results are filled in).
	state atomic.Int32
}

// States of op.state.
const (
	opPending int32 = iota
	opWritten
	opAbandoned
)

// abandon marks o given up by its caller after do failed. It reports false
// when o's batch committed first: its results are filled in and stand.
func (o *op) abandon() bool { return o.state.CompareAndSwap(opPending, opAbandoned) }

// newBatcher builds the store's batcher; coalesce.New applies the
// defaults of MaxBatch, Timeout and Writers.
func newBatcher(d BatchDriver, opts BatchOptions) *batcher {
	b := &batcher{d: d, opts: opts}
	b.c = coalesce.New(coalesce.Options{MaxBatch: opts.MaxBatch, MaxWait: opts.MaxWait,
		Writers: opts.Writers, Timeout: opts.Timeout}, b.write)
	return b
}

// do queues o and waits for its batch to be committed, writing batches
// itself when no writer is free. It returns the batch's error, ctx's when
// ctx ends first, or ErrClosed. When ctx ended while o's batch was being
// written, the batch may still commit: do then returns ctx's error only
// if the writer has not committed o yet, and the writer gives back the
// claim o took (write); otherwise o's results are filled in and do
// returns nil.
func (b *batcher) do(ctx context.Context, o *op) error {
	err := b.c.Do(ctx, o)
	if err != nil && ctx.Err() != nil && !o.abandon() {
		return nil // committed as ctx ended: the results stand
	}
	return err
}

// close fails the queued ops with ErrClosed and waits for the batches
// being written.
func (b *batcher) close() { b.c.Close(ErrClosed) }

// write writes one batch (the ops whose callers still wait) and fills in
// their results; an error fails them all. A claim repeating an earlier
// one's (scope, event ID) follows it instead of entering the statement.
// A claim the batch took for a caller that gave up meanwhile (its context
// ended while the batch waited on the database: the caller answered 503)
// is released at once, in a batch of its own, so the event is not left
// in flight, answered 409, until its lease expires, then held under
// on_ambiguous hold although it was never forwarded. If that release
// fails, the lease expires as after a crash.
func (b *batcher) write(ctx context.Context, batch []*op) error {
	var (
		wb      Batch
		leaders map[claimKey]int
		leader  = make([]int, 0, len(batch)) // per op: its claim's index in wb.Claims, or -1
	)
	for _, o := range batch {
		if o.settle != nil {
			wb.Settles = append(wb.Settles, *o.settle)
			leader = append(leader, -1)
			continue
		}
		if leaders == nil {
			leaders = make(map[claimKey]int, len(batch))
		}
		k := claimKey{o.claim.Scope, o.claim.EventID}
		i, ok := leaders[k]
		if !ok {
			i = len(wb.Claims)
			leaders[k] = i
			wb.Claims = append(wb.Claims, *o.claim)
		} else {
			o.follows = &BatchClaim{} // filled below
		}
		leader = append(leader, i)
	}
	b.observe(&wb, len(batch))

	if err := b.d.WriteBatch(ctx, &wb); err != nil {
		return err
	}
	si := 0
	for n, o := range batch {
		switch {
		case o.settle != nil:
			*o.settle = wb.Settles[si]
			si++
		case o.follows != nil:
			*o.follows = wb.Claims[leader[n]]
		default:
			*o.claim = wb.Claims[leader[n]]
		}
	}
	var orphans Batch
	for _, o := range batch {
		if o.state.CompareAndSwap(opPending, opWritten) {
			continue
		}
		if c := o.claim; c != nil && o.follows == nil && c.Claimed {
			orphans.Settles = append(orphans.Settles,
				BatchSettle{Stmt: StmtRelease, Scope: c.Scope, EventID: c.EventID, Token: c.Token})
		}
	}
	if len(orphans.Settles) > 0 {
		b.observe(&orphans, len(orphans.Settles))
		_ = b.d.WriteBatch(ctx, &orphans) // on failure the lease expires (see above)
	}
	return nil
}

func (b *batcher) observe(wb *Batch, total int) {
	if b.opts.Observe == nil {
		return
	}
	var complete, release, hold int
	for _, s := range wb.Settles {
		switch s.Stmt {
		case StmtComplete:
			complete++
		case StmtHold:
			hold++
		default:
			release++
		}
	}
	claims := total - len(wb.Settles)
	for _, c := range [...]struct {
		op string
		n  int
	}{{"claim", claims}, {"complete", complete}, {"release", release}, {"hold", hold}} {
		if c.n > 0 {
			b.opts.Observe(c.op, c.n)
		}
	}
	b.opts.Observe("transaction", total)
}

type claimKey struct{ scope, eventID string }

// Queued reports how many operations wait for a batch to be taken; 0 for
// unbatched rules (for tests and diagnostics).
func (r Rules) Queued() int {
	if r.b == nil {
		return 0
	}
	return r.b.c.Queued()
}
