package store

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// Defaults of BatchOptions.
const (
	DefaultMaxBatch     = 128
	DefaultBatchTimeout = 5 * time.Second
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
	// "claim", "complete" or "release" with the count of that kind, and
	// "transaction" with the batch's total. Called by the goroutine writing
	// the batch, before it is written: it must be quick.
	Observe func(op string, n int)
}

// batcher is the coalescer, by flat combining: a caller queues its op;
// when fewer than Writers batches are being written, it becomes a writer
// itself, takes what is queued (up to MaxBatch, its own op first) and
// writes it with one WriteBatch, on its own goroutine, so a lone delivery
// pays no hand-off to another goroutine. Ops queued meanwhile wait for the
// next batch; a writer whose own op is done hands what is left to a new
// goroutine, so no caller waits for batches that are not its own.
type batcher struct {
	d    BatchDriver
	opts BatchOptions

	mu      sync.Mutex
	queue   []*op
	writers int  // batches being written
	closed  bool // no more ops are queued
	wg      sync.WaitGroup
}

// op is one caller's claim or settle; done receives the batch's error.
type op struct {
	ctx    context.Context
	claim  *BatchClaim
	settle *BatchSettle
	// follows is set by the writer on a claim whose (scope, event ID) an
	// earlier claim of the same batch carries: its result is derived from
	// the leader's, as if it had run right after it.
	follows *BatchClaim
	done    chan error
}

func newBatcher(d BatchDriver, opts BatchOptions) *batcher {
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = DefaultMaxBatch
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultBatchTimeout
	}
	if opts.Writers <= 0 {
		opts.Writers = 1
	}
	return &batcher{d: d, opts: opts}
}

// do queues o and waits for its batch to be committed, writing batches
// itself when no writer is free. It returns the batch's error, ctx's when
// ctx ends first (the op may still be written), or ErrClosed.
func (b *batcher) do(ctx context.Context, o *op) error {
	o.ctx = ctx
	o.done = make(chan error, 1)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	b.queue = append(b.queue, o)
	lead := b.writers < b.opts.Writers
	if lead {
		b.writers++
		b.wg.Add(1)
	}
	b.mu.Unlock()
	if lead {
		b.lead(o)
	}
	select {
	case err := <-o.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// lead writes batches until own is answered, then hands what is queued to
// a new goroutine (or stops when nothing is).
func (b *batcher) lead(own *op) {
	for {
		batch := b.take()
		if batch == nil {
			return
		}
		b.write(batch)
		select {
		case err := <-own.done:
			own.done <- err // put back for do
			b.mu.Lock()
			if len(b.queue) == 0 {
				b.writers--
				b.wg.Done()
				b.mu.Unlock()
				return
			}
			b.mu.Unlock()
			go b.drain()
			return
		default:
		}
	}
}

// drain writes batches until the queue is empty.
func (b *batcher) drain() {
	for {
		batch := b.take()
		if batch == nil {
			return
		}
		b.write(batch)
	}
}

// take removes the next batch from the queue (waiting MaxWait for it to
// fill, if set), or, when the queue is empty, retires the writer and
// returns nil.
func (b *batcher) take() []*op {
	if b.opts.MaxWait > 0 {
		b.mu.Lock()
		n := len(b.queue)
		b.mu.Unlock()
		if n > 0 && n < b.opts.MaxBatch {
			time.Sleep(b.opts.MaxWait)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 {
		b.writers--
		b.wg.Done()
		return nil
	}
	n := min(len(b.queue), b.opts.MaxBatch)
	batch := slices.Clone(b.queue[:n])
	clear(b.queue[:n])
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil
	}
	return batch
}

// close fails the queued ops with ErrClosed and waits for the batches
// being written.
func (b *batcher) close() {
	b.mu.Lock()
	b.closed = true
	queued := b.queue
	b.queue = nil
	b.mu.Unlock()
	for _, o := range queued {
		o.done <- ErrClosed
	}
	b.wg.Wait()
}

// write writes one batch and answers its ops. Ops whose caller has given
// up are left out; a claim repeating an earlier one's (scope, event ID)
// follows it instead of entering the statement.
func (b *batcher) write(batch []*op) {
	var (
		wb      Batch
		leaders map[claimKey]int
		live    = make([]*op, 0, len(batch))
		leader  = make([]int, 0, len(batch)) // per live op: its claim's index in wb.Claims, or -1
	)
	for _, o := range batch {
		if err := o.ctx.Err(); err != nil {
			o.done <- err
			continue
		}
		live = append(live, o)
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
	if len(live) == 0 {
		return
	}
	b.observe(&wb, len(live))

	ctx, cancel := context.WithTimeout(context.Background(), b.opts.Timeout)
	err := b.d.WriteBatch(ctx, &wb)
	cancel()

	si := 0
	for n, o := range live {
		switch {
		case err != nil:
		case o.settle != nil:
			*o.settle = wb.Settles[si]
			si++
		case o.follows != nil:
			*o.follows = wb.Claims[leader[n]]
		default:
			*o.claim = wb.Claims[leader[n]]
		}
		o.done <- err
	}
}

func (b *batcher) observe(wb *Batch, total int) {
	if b.opts.Observe == nil {
		return
	}
	var complete, release int
	for _, s := range wb.Settles {
		if s.Stmt == StmtComplete {
			complete++
		} else {
			release++
		}
	}
	claims := total - len(wb.Settles)
	for _, c := range [...]struct {
		op string
		n  int
	}{{"claim", claims}, {"complete", complete}, {"release", release}} {
		if c.n > 0 {
			b.opts.Observe(c.op, c.n)
		}
	}
	b.opts.Observe("transaction", total)
}

type claimKey struct{ scope, eventID string }
